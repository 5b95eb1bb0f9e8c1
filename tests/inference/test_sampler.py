import pytest
import torch

from inference.layers.sampler import Sampler, generator_for
from inference.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0)


@pytest.fixture
def sampler():
    return Sampler()


def random_logits(rows=4, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax(sampler):
    logits = random_logits()
    tokens = sampler(logits, [GREEDY] * 4, [[]] * 4, [None] * 4)
    assert torch.equal(tokens, logits.argmax(-1))


def test_greedy_probs_are_one_hot(sampler):
    logits = random_logits()
    probs = sampler.probs(logits, [GREEDY] * 4, [[]] * 4)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 50).float())


def test_greedy_takes_first_max_on_ties(sampler):
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert sampler(logits, [GREEDY], [[]], [None]).item() == 1


def test_greedy_accepts_half_precision_logits(sampler):
    logits = random_logits().to(torch.bfloat16)
    probs = sampler.probs(logits, [GREEDY] * 4, [[]] * 4)
    assert probs.dtype == torch.float32
    assert torch.equal(probs.argmax(-1), logits.float().argmax(-1))


def test_top_k_one_matches_greedy(sampler):
    logits = random_logits()
    params = [SamplingParams(temperature=0.8, top_k=1)] * 4
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    assert torch.equal(sampler(logits, params, [[]] * 4, gens), logits.argmax(-1))
    assert torch.equal(
        sampler.probs(logits, params, [[]] * 4), sampler.probs(logits, [GREEDY] * 4, [[]] * 4)
    )


def test_top_k_keeps_the_k_largest(sampler):
    logits = random_logits(rows=1)
    probs = sampler.probs(logits, [SamplingParams(top_k=5)], [[]])[0]
    kept = set(torch.nonzero(probs).flatten().tolist())
    assert kept == set(logits[0].topk(5).indices.tolist())
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_the_smallest_nucleus(sampler):
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    probs = sampler.probs(logits, [SamplingParams(top_p=0.7)], [[]])[0]
    # 0.5 alone misses 0.7; 0.5 + 0.3 reaches it, so exactly two survive.
    assert probs.tolist() == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_top_p_always_keeps_one_token(sampler):
    logits = torch.tensor([[4.0, 1.0, 0.0]])
    probs = sampler.probs(logits, [SamplingParams(top_p=1e-6)], [[]])[0]
    assert probs.tolist() == [1.0, 0.0, 0.0]


def test_repetition_penalty_pushes_seen_tokens_down(sampler):
    logits = torch.tensor([[2.0, -2.0, 2.0, -2.0]])
    params = [SamplingParams(repetition_penalty=2.0)]
    probs = sampler.probs(logits, params, [[0, 1]])[0]
    plain = sampler.probs(logits, [SamplingParams()], [[]])[0]
    expected = torch.tensor([1.0, -4.0, 2.0, -2.0]).softmax(-1)  # 2/2 and -2*2
    assert torch.allclose(probs, expected)
    assert probs[0] < plain[0] and probs[1] < plain[1]


def test_repetition_penalty_below_one_rewards_seen_tokens(sampler):
    logits = torch.tensor([[1.0, 1.0]])
    probs = sampler.probs(logits, [SamplingParams(repetition_penalty=0.5)], [[1]])[0]
    assert probs[1] > probs[0]


def test_repetition_penalty_steers_greedy(sampler):
    logits = torch.tensor([[3.0, 2.0, 0.0]])
    params = [SamplingParams(temperature=0, repetition_penalty=2.0)]
    assert sampler(logits, params, [[0]], [None]).item() == 1


def test_batched_rows_match_rows_done_one_at_a_time(sampler):
    logits = random_logits(rows=5, vocab=40, seed=3)
    params = [
        GREEDY,
        SamplingParams(temperature=0.7, top_k=8),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.9, top_k=20, top_p=0.9, repetition_penalty=1.5),
        SamplingParams(temperature=0, repetition_penalty=3.0),
    ]
    history = [[1, 2], [], [5, 5, 6], [0, 39, 7], [int(logits[4].argmax())]]
    batched = sampler.probs(logits, params, history)
    for i in range(5):
        alone = sampler.probs(logits[i : i + 1], [params[i]], [history[i]])
        assert torch.allclose(batched[i : i + 1], alone, atol=1e-7), i

    seeds = [SamplingParams(**{**vars(p), "seed": 100 + i}) for i, p in enumerate(params)]
    gens = [generator_for(p, "cpu") for p in seeds]
    batched_tokens = sampler(logits, seeds, history, gens)
    for i in range(5):
        alone = sampler(
            logits[i : i + 1], [seeds[i]], [history[i]], [generator_for(seeds[i], "cpu")]
        )
        assert batched_tokens[i] == alone[0], i


def test_seeded_sampling_is_reproducible(sampler):
    logits = random_logits(rows=1, vocab=100).repeat(3, 1)
    params = [SamplingParams(temperature=1.0, seed=7)] * 3

    def draw():
        gens = [generator_for(p, "cpu") for p in params]
        return torch.stack([sampler(logits, params, [[]] * 3, gens) for _ in range(20)])

    first, second = draw(), draw()
    assert torch.equal(first, second)
    assert len(set(first[:, 0].tolist())) > 1  # actually sampled, not stuck on one token


def test_generator_for_unseeded_request_is_none():
    assert generator_for(SamplingParams(), "cpu") is None


def test_temperature_one_follows_softmax(sampler):
    logits = torch.tensor([1.0, 0.0, -1.0, 2.0, 0.5])
    expected = logits.softmax(-1)
    n = 20000
    params = [SamplingParams(temperature=1.0)] * n
    torch.manual_seed(1234)
    tokens = sampler(logits.repeat(n, 1), params, [[]] * n)
    counts = torch.bincount(tokens, minlength=5).double()
    chi2 = (((counts - n * expected) ** 2) / (n * expected)).sum().item()
    # 4 degrees of freedom: p = 0.001 at 18.5; a broken sampler lands in the thousands.
    assert chi2 < 25, (chi2, counts.tolist())


def test_low_temperature_sharpens(sampler):
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    cold = sampler.probs(logits, [SamplingParams(temperature=0.5)], [[]])[0]
    warm = sampler.probs(logits, [SamplingParams(temperature=2.0)], [[]])[0]
    assert torch.allclose(cold, (logits[0] / 0.5).softmax(-1))
    assert cold[0] > logits.softmax(-1)[0, 0] > warm[0]


def test_top_k_larger_than_vocab_is_off(sampler):
    logits = random_logits(rows=2, vocab=10)
    params = [SamplingParams(top_k=50), SamplingParams(top_k=3)]
    probs = sampler.probs(logits, params, [[], []])
    assert torch.allclose(probs[0], logits[0].softmax(-1))
    assert (probs[1] > 0).sum() == 3
