"""The demo's embedder (inference/embedder.py), its training (demo/train_embedder.py)
and /v1/embeddings (inference/server/embeddings.py): n-grams, a saved model read back the same, the
API in OpenAI's shape, the knowledge base's client over real HTTP, and a training run that
learns which chunk answers which question without ever seeing an evaluation question."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.knowledge.embeddings import EmbeddingClient
from demo import train_embedder
from demo.grounded import DEMO_EMBEDDER
from inference.embedder import Embedder, EmbedderConfig, buckets_of, ngrams, read_config
from inference.server.embeddings import embeddings_app, serving

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / DEMO_EMBEDDER


def test_ngrams_of_chinese_runs_english_words_and_numbers():
    grams = ngrams("年假 VPN，１５天", EmbedderConfig())
    assert {"c1:年", "c1:假", "c2:年假", "w:vpn", "l3:<vp", "l3:pn>", "d:15"} <= set(grams)
    assert not any(g.startswith("c3:") for g in grams)  # the default orders: 1 and 2
    assert ngrams("", EmbedderConfig()) == [] and ngrams("！？…", EmbedderConfig()) == []
    config = EmbedderConfig(buckets=97)
    assert all(0 <= b < 97 for b in buckets_of("年假有几天 how many days", config))
    assert buckets_of("年假", config) == buckets_of("年假", config)  # stable: crc32, not hash()


def test_a_saved_embedder_reads_back_the_same(tmp_path):
    model = Embedder(EmbedderConfig(buckets=1024, dim=8, min_similarity=0.7, min_score=0.3))
    texts = ["年假有几天？", "VPN password reset", ""]
    before = model.embed(texts)
    assert torch.allclose(before[:2].norm(dim=1), torch.ones(2)) and before[2].abs().sum() == 0
    model.save(tmp_path)
    loaded = Embedder.load(tmp_path)
    assert torch.allclose(loaded.embed(texts), before, atol=2e-3)  # stored in fp16
    assert loaded.config == model.config
    assert read_config(tmp_path).chosen_settings() == {"kb_min_similarity": 0.7, "kb_min_score": 0.3}
    assert read_config(tmp_path / "nothing") is None
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, "dim": 16}))
    with pytest.raises(ValueError, match="embeddings should be"):
        Embedder.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "model_type": "glm4"}))
    with pytest.raises(ValueError, match="not an embedder"):
        Embedder.load(tmp_path)


@pytest.fixture(scope="module")
def small():
    return Embedder(EmbedderConfig(buckets=4096, dim=16))


def test_the_api_answers_in_openais_shape(small):
    client = embeddings_app(small, "tiny").test_client()
    one = client.post("/v1/embeddings", json={"input": "年假有几天", "model": "tiny"}).get_json()
    assert one["object"] == "list" and one["model"] == "tiny" and len(one["data"]) == 1
    assert one["data"][0] == {"object": "embedding", "index": 0, "embedding": one["data"][0]["embedding"]}
    assert np.allclose(one["data"][0]["embedding"], small.embed(["年假有几天"])[0].numpy(), atol=1e-6)
    assert one["usage"] == {"prompt_tokens": 9, "total_tokens": 9}  # 5 characters, 4 pairs
    many = client.post("/v1/embeddings", json={"input": ["a b c", "年假"], "encoding_format": "base64"}).get_json()
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in many["data"]]
    assert [d["index"] for d in many["data"]] == [0, 1]
    assert np.allclose(decoded, small.embed(["a b c", "年假"]).numpy(), atol=1e-6)


@pytest.mark.parametrize("body, status, says", [
    ({"input": [1, 2, 3]}, 400, "input"),  # token ids: this model reads text
    ({"input": []}, 400, "input"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": ["x"] * 2049}, 400, "at most 2048"),
    ({"input": "x" * 40_000}, 400, "characters"),
    ({"input": "x", "model": "other"}, 404, "does not exist"),
    ({"model": "tiny"}, 400, "input"),
])
def test_a_bad_request_gets_a_4xx_not_a_500(small, body, status, says):
    client = embeddings_app(small, "tiny").test_client()
    response = client.post("/v1/embeddings", json=body)
    assert response.status_code == status and says in response.get_json()["error"]["message"]
    assert client.post("/v1/embeddings", data=b"{not json").status_code == 400
    assert client.post("/v1/embeddings", data=b"[" * 100_000).status_code == 400
    assert client.post("/v1/embeddings", data=b"x" * (9 * 1024 * 1024)).status_code == 413
    assert client.get("/v1/embeddings").status_code == 405


def test_the_knowledge_bases_client_reads_the_served_vectors(tmp_path):
    Embedder(EmbedderConfig(buckets=2048, dim=12)).save(tmp_path / "tiny-embed")
    texts = [f"问题 {i} question" for i in range(70)]  # more than the client's batch of 64
    with serving(tmp_path / "tiny-embed") as (url, embedder):
        vectors = EmbeddingClient(url, "tiny-embed").embed(texts)
    assert np.allclose(np.stack(vectors), embedder.embed(texts).numpy(), atol=1e-6)


def test_training_learns_which_chunk_answers_and_keeps_unanswerable_questions_low():
    chunks = ["年假：入职第一年 10 天", "VPN 客户端 Xinghe Connect，服务器 vpn.xinghe.com",
              "报销：费用发生后 30 天内提交", "班车：张江站末班 19:30"]
    questions = [("年假有几天", {0}), ("第一年能休几天假", {0}), ("VPN 用什么客户端", {1}),
                 ("vpn 服务器地址", {1}), ("报销期限", {2}), ("多少天内要报销", {2}),
                 ("班车几点", {3}), ("末班车时间", {3})]
    unanswerable = ["公司年会在哪里", "股票期权怎么行权"]
    data = train_embedder.Data(chunks, questions, unanswerable, [], [])
    model = train_embedder.train(data, seed=0, epochs=40, log=lambda *_: None)
    sims = model.embed([q for q, _ in questions]) @ model.embed(chunks).T
    assert [int(i) for i in sims.argmax(dim=1)] == [next(iter(s)) for _, s in questions]
    worst = (model.embed(unanswerable) @ model.embed(chunks).T).max()
    assert float(worst) < float(sims.max(dim=1).values.min())


def test_thresholds_are_the_pair_with_the_best_balanced_accuracy():
    # (coverage, cosine of a right best chunk or None) for paraphrases; (coverage, best cosine)
    right = [(0.2, 0.9), (0.2, 0.8), (0.7, None), (0.1, 0.75), (0.1, None)]
    wrong = [(0.2, 0.7), (0.1, 0.5), (0.4, 0.3)]
    similarity, score = train_embedder.choose_thresholds(right, wrong, log=lambda *_: None)
    assert (similarity, score) == (0.75, 0.5)  # 4 of 5 through, 3 of 3 kept out


@pytest.fixture(scope="module")
def corpus():
    return train_embedder.gather()


def test_no_held_out_or_evaluation_wording_is_trained_on(corpus):
    """Trained on: qa.jsonl's questions and paraphrases and embedder_questions.jsonl's wordings
    (always) and unanswerable questions (both files); never a held-out or evaluation question."""
    from demo import eval_sets
    from demo.corpus import load_embedder_questions, load_qa, load_unanswerable

    data = train_embedder.split(corpus, None, __import__("random").Random(0))
    trained = {q for q, _ in data.questions}
    held_out = {q for item in load_qa() for q in item["heldout"]}
    evaluation = eval_sets.questions()
    assert trained and not trained & held_out and not trained & evaluation
    assert not set(data.unanswerable) & (held_out | evaluation)
    more = load_embedder_questions()
    assert {r["question"] for r in more if "answers" in r} <= trained
    assert {r["question"] for r in [*more, *load_unanswerable()] if "near" in r} == set(data.unanswerable)
    assert len(corpus.chunks) > 50 and len(corpus.items) > 200 and len(corpus.unanswerable) >= 250


def test_an_item_is_taught_the_chunks_its_own_language_finds_in_each_edition(corpus):
    """Each item's right chunks: one an edition, found in that edition's language (the item's
    answer or its twin's), the same for both twins. Matched across languages, "婚假为10天" found
    the English annual-leave bullet ("10 days" too) and the sick-note rule the referral bonus."""
    chunks_of = {wordings[0]: sources for wordings, sources in corpus.items}
    for question, wanted in [("婚假有几天？", ("Marriage leave", "婚假：**10 天**")),
                             ("Do I need a doctor's note for sick leave?", ("doctor's", "医生证明"))]:
        texts = [corpus.chunks[row] for row in chunks_of[question]]
        assert len(texts) == 2 and all(any(w in t for t in texts) for w in wanted), texts
    assert chunks_of["婚假有几天？"] == chunks_of["How long is marriage leave?"]


def test_the_shipped_embedder_finds_new_wordings_chunks(corpus):
    """models/demo-embed against the handbook: the held-out paraphrases (never trained on) find
    a chunk that answers them first more often than not, and its thresholds are its config's."""
    from demo.corpus import load_qa

    model = Embedder.load(SHIPPED)
    assert 0.3 <= model.config.min_similarity <= 0.95 and model.config.min_score is not None
    sources = {tuple(w): s for w, s in corpus.items}
    chunks = model.embed(corpus.chunks)
    hits = total = 0
    for item in load_qa():
        key = (item["question"], *item["paraphrases"])
        if key not in sources:
            continue
        for question in item["heldout"]:
            total += 1
            hits += int((model.embed([question])[0] @ chunks.T).argmax()) in sources[key]
    assert total > 200 and hits / total > 0.5


def test_the_knowledge_base_ranks_and_decides_with_the_served_vectors():
    """The evaluation's knowledge base with the shipped embedder: chunks embedded at upload over
    HTTP, the thresholds its training chose, and a new wording the BM25 coverage alone declines
    let through by its cosine."""
    from app.knowledge.evaluate import scratch_knowledge_base
    from app.knowledge.retrieval import Retriever
    from demo.corpus import HANDBOOKS

    chosen = read_config(SHIPPED)
    with scratch_knowledge_base(HANDBOOKS, embeddings=str(SHIPPED), kb_chunk_tokens=100) as services:
        settings = services.settings
        assert (settings.kb_min_similarity, settings.kb_min_score) == (chosen.min_similarity, chosen.min_score)
        retriever = Retriever(services)
        question = "我下个月领证，婚假怎么算"  # a held-out paraphrase; the handbook: 婚假：10 天
        result = retriever.search(question, [])
        answering = ("婚假：**10 天**", "Marriage leave 婚假: **10 days**")  # either edition's line
        assert result.found and any(line in result.passages[0].text for line in answering)
        assert result.passages[0].similarity >= chosen.min_similarity > 0
        assert result.passages[0].coverage < chosen.min_score  # BM25's coverage alone: declined
        assert not retriever.search("明天上海会下雨吗？", []).found
