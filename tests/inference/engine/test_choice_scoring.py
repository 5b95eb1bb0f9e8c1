"""Choosing among whole replies by likelihood (`SamplingParams.choice_scoring="likelihood"`):
each reply's score is its mean token log-probability given the prompt, as one full forward
computes it, whatever the engine's batching, chunking and prefix cache did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference.engine import EngineArgs, LLMEngine, PromptTooLongError
from inference.sampling_params import SamplingParams

DEMO = Path(__file__).resolve().parents[3] / "models" / "demo"
PASSAGES = ("资料 / Passages:\n[1] 员工手册 › 假期\n员工入职满一年后，每年享有 10 天带薪年假，当年未休完的可顺延至次年 3 月底。\n"
            "[2] 员工手册 › IT\nVPN 客户端请从 IT 门户下载，首次登录需要绑定手机令牌。\n"
            "[3] 员工手册 › 报销\n差旅报销须在出差结束后 30 天内提交，附发票原件。")
MESSAGES = [{"role": "system", "content": "请根据资料回答，并标注来源编号。\n" + PASSAGES},
            {"role": "user", "content": "我一年能休几天假？"}]
REPLIES = ["员工入职满一年后，每年享有 10 天带薪年假，当年未休完的可顺延至次年 3 月底。 [1]",
           "VPN 客户端请从 IT 门户下载，首次登录需要绑定手机令牌。 [2]",
           "差旅报销须在出差结束后 30 天内提交，附发票原件。 [3]",
           "抱歉，资料里没有找到答案。"]


def engine(**overrides) -> LLMEngine:
    args = {"model": str(DEMO), "max_num_seqs": 8, "max_model_len": 512, "block_size": 64, **overrides}
    return LLMEngine.from_engine_args(EngineArgs(**args))


@pytest.fixture(scope="module")
def demo() -> LLMEngine:
    return engine()


@torch.inference_mode()
def reference_scores(eng: LLMEngine, messages: list[dict], replies: list[str]) -> list[float]:
    """Mean log-probability of each reply and its EOS after the prompt, from one plain forward."""
    model, prompt = eng.model, eng.prompt_ids(messages)
    scores = []
    for reply in replies:
        tail = [*eng.tokenizer.reply_ids(reply), eng.end_token_id]
        ids = torch.tensor([*prompt, *tail])
        hidden = model(ids, torch.arange(len(ids)), model.new_cache())
        logprobs = torch.log_softmax(model.compute_logits(hidden[len(prompt) - 1 : -1]).float(), dim=-1)
        scores.append(logprobs.gather(1, torch.tensor(tail)[:, None]).mean().item())
    return scores


def scored(eng: LLMEngine, messages: list[dict], replies: list[str], **params):
    """Run one scoring request to its end; its output and its `ChoiceScoring`."""
    params = {"temperature": 0, "max_tokens": 200, **params}
    request = eng.add_request(messages, SamplingParams(choice=replies, choice_scoring="likelihood", **params))
    scoring = eng.requests[request].scoring
    final = None
    while final is None:
        final = next((o for o in eng.step() if o.request_id == request and o.finished), None)
    return final, scoring


def test_scores_are_one_full_forwards_and_the_best_reply_wins(demo):
    final, scoring = scored(demo, MESSAGES, REPLIES)
    expected = reference_scores(demo, MESSAGES, REPLIES)
    assert scoring.scores() == pytest.approx(expected, abs=1e-4)
    best = REPLIES[max(range(len(REPLIES)), key=expected.__getitem__)]
    assert final.text.strip() == best and final.finish_reason == "stop"
    assert final.token_ids == [*demo.tokenizer.reply_ids(best), demo.end_token_id]
    assert demo.block_manager.all_free() and not demo.has_unfinished_requests()


@pytest.mark.parametrize("order", [[3, 2, 1, 0], [1, 0, 3, 2]])
def test_the_choice_does_not_depend_on_where_a_reply_is_listed(demo, order):
    first, _ = scored(demo, MESSAGES, REPLIES)
    listed = [REPLIES[i] for i in order]
    again, scoring = scored(demo, MESSAGES, listed)
    assert again.text == first.text
    assert scoring.scores() == pytest.approx(reference_scores(demo, MESSAGES, listed), abs=1e-4)


def test_the_replies_read_the_prompt_from_the_prefix_cache_and_score_the_same_without_it(demo):
    cold = engine(enable_prefix_caching=False)
    _, without = scored(cold, MESSAGES, REPLIES)
    _, warm = scored(demo, MESSAGES, REPLIES)
    prompt = len(demo.prompt_ids(MESSAGES))
    assert all(child.num_cached_tokens == prompt // 64 * 64 > 0 for child in warm.children)
    assert all(child.num_cached_tokens == 0 for child in without.children)
    assert warm.scores() == pytest.approx(without.scores(), abs=1e-4)


def test_a_repeated_request_recomputes_its_replies_even_when_their_blocks_are_cached(demo):
    """Replies long enough to fill cache blocks of their own: the second time those blocks are
    in the prefix cache, but their rows' logits are what the score needs."""
    long = [reply * 4 for reply in REPLIES[:2]]
    expected = reference_scores(demo, MESSAGES, long)
    for _ in range(2):
        _, scoring = scored(demo, MESSAGES, long)
        assert scoring.scores() == pytest.approx(expected, abs=1e-4)
        prompt = len(demo.prompt_ids(MESSAGES))
        assert all(child.num_cached_tokens == prompt // 64 * 64 for child in scoring.children)


def test_chunked_prefill_and_a_crowded_batch_change_no_score(demo):
    """Chunks of 24 tokens (the prompt and each reply over several steps), while two plain
    requests decode in the same batches: the same scores, and the neighbours' own tokens."""
    other = [{"role": "user", "content": "VPN 怎么连？"}]
    alone = demo.generate([other], SamplingParams(temperature=0, max_tokens=24))[0]
    chunked = engine(max_num_batched_tokens=24)
    request = chunked.add_request(MESSAGES, SamplingParams(temperature=0, max_tokens=200, choice=REPLIES,
                                                           choice_scoring="likelihood"))
    scoring = chunked.requests[request].scoring
    neighbours = [chunked.add_request(other, SamplingParams(temperature=0, max_tokens=24)) for _ in range(2)]
    final = {}
    while chunked.has_unfinished_requests():
        final.update({o.request_id: o for o in chunked.step() if o.finished})
    assert scoring.scores() == pytest.approx(reference_scores(demo, MESSAGES, REPLIES), abs=1e-4)
    assert all(final[n].token_ids == alone.token_ids for n in neighbours)
    assert final[request].text.strip() in REPLIES


def test_sampling_draws_among_the_replies_reproducibly(demo):
    drawn = [demo.generate([MESSAGES], SamplingParams(temperature=2.0, seed=seed, max_tokens=200, choice=REPLIES,
                                                      choice_scoring="likelihood"))[0].text.strip()
             for seed in (1, 2, 3, 1)]
    assert set(drawn) <= set(REPLIES) and drawn[0] == drawn[3]


def test_a_short_max_tokens_cuts_the_reply_and_says_length(demo):
    final, _ = scored(demo, MESSAGES, REPLIES[:1], max_tokens=5)
    assert final.finish_reason == "length" and len(final.token_ids) == 5


def test_abort_frees_the_prompt_and_every_reply(demo):
    request = demo.add_request(MESSAGES, SamplingParams(temperature=0, choice=REPLIES, choice_scoring="likelihood"))
    demo.step()  # the prompt: the replies are queued now
    assert len(demo.scheduler.waiting) + len(demo.scheduler.running) == len(REPLIES)
    demo.step()
    demo.abort_request(request)
    assert not demo.has_unfinished_requests() and demo.block_manager.all_free()


def test_a_reply_too_long_for_max_model_len_is_refused_up_front(demo):
    with pytest.raises(PromptTooLongError):
        demo.add_request(MESSAGES, SamplingParams(choice=["年假" * 400], choice_scoring="likelihood"))
    with pytest.raises(ValueError, match="choice_scoring"):
        SamplingParams(choice=["a"], choice_scoring="best")


def test_a_bias_is_added_to_its_replys_score(demo):
    _, scoring = scored(demo, MESSAGES, REPLIES)
    raw = scoring.scores()
    worst = min(range(len(REPLIES)), key=raw.__getitem__)
    lift = max(raw) - raw[worst] + 0.01  # just enough to put the least likely reply first
    bias = [lift if i == worst else 0.0 for i in range(len(REPLIES))]
    final, lifted = scored(demo, MESSAGES, REPLIES, choice_bias=bias)
    assert final.text.strip() == REPLIES[worst] and lifted.scores() == pytest.approx(raw, abs=1e-5)
    bias[worst] = lift - 0.02
    final, _ = scored(demo, MESSAGES, REPLIES, choice_bias=bias)
    assert final.text.strip() == REPLIES[max(range(len(REPLIES)), key=raw.__getitem__)]
    with pytest.raises(ValueError, match="one number per choice"):
        SamplingParams(choice=REPLIES, choice_scoring="likelihood", choice_bias=[1.0])
    with pytest.raises(ValueError, match="one number per choice"):
        SamplingParams(choice=REPLIES, choice_bias=bias)


def test_a_reply_preempted_halfway_is_recomputed_to_the_same_score(demo):
    """Replies prefilled in chunks of 64 tokens; one is preempted halfway (its blocks released,
    as the scheduler does when blocks run out) and recomputed from the prefix cache."""
    chunked = engine(max_num_batched_tokens=64)
    long = [reply * 4 for reply in REPLIES]
    request = chunked.add_request(MESSAGES, SamplingParams(temperature=0, max_tokens=400, choice=long,
                                                           choice_scoring="likelihood"))
    scoring, final, preempted = chunked.requests[request].scoring, None, None
    while final is None:
        final = next((o for o in chunked.step() if o.request_id == request and o.finished), None)
        halfway = [c for c in chunked.scheduler.running if 0 < c.num_computed_tokens < c.num_tokens]
        if preempted is None and halfway:
            preempted = halfway[0]
            chunked.scheduler.running.remove(preempted)
            chunked.scheduler.preempt(preempted)
    assert preempted is not None and chunked.scheduler.num_preemptions == 1
    assert scoring.scores() == pytest.approx(reference_scores(demo, MESSAGES, long), abs=1e-4)
    assert chunked.block_manager.all_free()
