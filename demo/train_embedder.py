"""Train the demo's embedder (``inference/embedder.py``) on its own questions and handbook:
``python -m demo.train_embedder [--out models/demo-embed]`` (about fifteen minutes on 2
cores, four fifths of it the validation folds; deterministic).

What it learns: which chunk of the handbook each training question (``qa.jsonl``'s questions
and paraphrases and ``embedder_questions.jsonl``'s more wordings of them, never the held-out ones
or an evaluation set) is answered from, found as
``demo.grounded`` finds it for the demo model (the answer searched as a question, the
best chunk of each edition in the item's sections), as a softmax over every chunk of both
editions (116 chunks: the whole handbook is each step's negatives). The questions the handbook
does not answer (``unanswerable.jsonl``'s and ``embedder_questions.jsonl``'s) are pushed below a
margin against every chunk, so that a similarity means "this chunk answers it", not "this
sounds like the handbook".

``KB_MIN_SIMILARITY`` and ``KB_MIN_SCORE`` (a passage is relevant when its cosine or its BM25
coverage clears its threshold, ``app/knowledge/retrieval.py``): chosen on ``FOLDS`` validation
runs (each keeps one paraphrase of every item and a fifth of the unanswerable questions out of
its training) as the pair with the best balanced accuracy over all the kept-out questions
(paraphrases let through to a right chunk, unanswerable questions kept out). The model is then
trained again on everything and the pair is written into its config, which ``make run`` and the
evaluation read.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass, replace

import torch
from sqlalchemy import select

from app.knowledge.evaluate import scratch_knowledge_base
from app.knowledge.retrieval import Retriever
from app.knowledge.store import CHUNK_ID_SPAN
from app.models import KnowledgeChunk
from demo.corpus import (
    COMPANY_ZH_PATH,
    HANDBOOKS,
    load_dialogues,
    load_embedder_questions,
    load_qa,
    load_unanswerable,
)
from demo.grounded import (
    DEMO_CHUNK_TOKENS,
    DEMO_EMBEDDER,
    DEMO_MIN_SCORE,
    UNGROUNDED_TOPICS,
    Builder,
)
from inference.embedder import Embedder, EmbedderConfig

# the scratch knowledge base uploads HANDBOOKS in order into a fresh database: document 1, 2, ...
# (a chunk's id is its document's id x CHUNK_ID_SPAN + its ordinal)
EDITION_DOCUMENT = {"zh" if path == COMPANY_ZH_PATH else "en": number
                    for number, (path, _) in enumerate(HANDBOOKS, 1)}
TEMPERATURE = 0.1
MARGIN = 0.3  # an unanswerable question's best chunk is pushed below this cosine
EPOCHS = 30
BATCH = 64
LEARNING_RATE = 0.05
FOLDS = 5


@dataclass
class Corpus:
    """Everything the embedder learns from, read once."""

    chunks: list[str]  # each chunk's indexed text (heading path + text), by row
    items: list[tuple[list[str], set[int]]]  # (an item's wordings, the rows of the chunks answering it)
    extra: list[tuple[str, set[int]]]  # answers, follow-ups, embedder_questions.jsonl's: always trained on
    unanswerable: list[str]
    coverage: dict[str, float]  # each question's best BM25 coverage (KB_MIN_SCORE's measure)


@dataclass
class Data:
    chunks: list[str]
    questions: list[tuple[str, set[int]]]  # (question, the rows of the chunks that answer it)
    unanswerable: list[str]
    held: list[tuple[str, set[int]]]  # a validation fold (empty when training on all)
    held_unanswerable: list[str]


def twin_key(item_id: str) -> tuple[str, int]:
    """``qa.jsonl`` writes each item twice, Chinese and English, with consecutive numbers
    ("hr-marriage-045" and "-046"): the key the two share."""
    name, number = item_id.rsplit("-", 1)
    return name, (int(number) + 1) // 2


def answering_chunks(builder: Builder, items: list[dict]) -> dict[str, set[int]]:
    """The chunks that answer each item: in each edition, the one that edition's own-language
    answer finds, the item's own in its language's edition and its twin's in the other.

    Why not each edition's best match for the item's answer alone: across languages BM25 matches
    little but glosses and numbers, and found the English "Annual leave 年假: 10 days" for "婚假为
    10天" and "Referral bonus" for the sick-note rule: wrong chunks taught as right ones."""
    own = {}
    for item in items:
        document = EDITION_DOCUMENT[item["lang"]]
        own[item["id"]] = {c for c in builder.sources_of(item["answer"], item["topic"])
                           if c // CHUNK_ID_SPAN == document}
    by_key: dict[tuple[str, int], set[int]] = {}
    for item in items:
        by_key.setdefault(twin_key(item["id"]), set()).update(own[item["id"]])
    return {item["id"]: by_key[twin_key(item["id"])] for item in items}


def gather() -> Corpus:
    with scratch_knowledge_base(HANDBOOKS, kb_chunk_tokens=DEMO_CHUNK_TOKENS) as services:
        builder = Builder(services, "", random.Random(0))
        cipher, rows = services.cipher, {}
        with services.db.reader() as session:
            for chunk_id, section, text in session.execute(
                    select(KnowledgeChunk.id, KnowledgeChunk.section_enc, KnowledgeChunk.text_enc)
                    .order_by(KnowledgeChunk.id)):
                section = cipher.decrypt(section, "kb_chunks", "section_enc", chunk_id)
                text = cipher.decrypt(text, "kb_chunks", "text_enc", chunk_id)
                rows[chunk_id] = f"{section}\n{text}" if section else text
        row_of = {chunk_id: i for i, chunk_id in enumerate(rows)}
        items, extra, sources_of = [], [], {}
        grounded = [item for item in load_qa() if item["topic"] not in UNGROUNDED_TOPICS]
        answering = answering_chunks(builder, grounded)
        for item in grounded:
            sources = {row_of[c] for c in answering[item["id"]]}
            if sources:
                items.append(([item["question"], *item["paraphrases"]], sources))
                extra.append((item["answer"], sources))  # the answer reads like its chunk too
                sources_of[item["id"]] = sources
        more = load_embedder_questions()
        extra += [(row["question"], sources_of[row["answers"]]) for row in more
                  if row.get("answers") in sources_of]
        for dialogue in load_dialogues():
            messages = dialogue["messages"]
            if len(messages) == 4:  # the follow-up, as the retriever asks it: with the question before
                sources = {row_of[c] for c in builder.sources_of(messages[3]["content"], "any")}
                if sources:
                    extra.append((f"{messages[0]['content']}\n{messages[2]['content']}", sources))
        unanswerable = [row["question"] for row in [*load_unanswerable(), *more] if "near" in row]
        retriever = Retriever(services)
        coverage = {}
        for question in [w for wordings, _ in items for w in wordings[1:]] + unanswerable:
            found = retriever.search(question, [], top_k=1, min_score=0.0).candidates
            coverage[question] = found[0].coverage if found else 0.0
    return Corpus(list(rows.values()), items, extra, unanswerable, coverage)


def split(corpus: Corpus, fold: int | None, rng: random.Random) -> Data:
    """Fold ``fold`` of ``FOLDS`` kept out (one paraphrase of each item, a fifth of the
    unanswerable questions), or nothing kept out (``None``)."""
    questions, held = list(corpus.extra), []
    for wordings, sources in corpus.items:
        wordings = list(wordings)
        if fold is not None and len(wordings) > 1:
            held.append((wordings.pop(rng.randrange(1, len(wordings))), sources))
        questions += [(q, sources) for q in wordings]
    unanswerable = [q for i, q in enumerate(corpus.unanswerable) if fold is None or i % FOLDS != fold]
    kept_out = [q for i, q in enumerate(corpus.unanswerable) if fold is not None and i % FOLDS == fold]
    return Data(corpus.chunks, questions, unanswerable, held, kept_out)


def train(data: Data, seed: int, epochs: int = EPOCHS, log=print) -> Embedder:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = Embedder(EmbedderConfig())
    optimizer = torch.optim.Adagrad(model.parameters(), lr=LEARNING_RATE)
    chunk_batch = model.batch(data.chunks)
    items = [(q, s) for q, s in data.questions] + [(q, None) for q in data.unanswerable]
    for epoch in range(epochs):
        rng.shuffle(items)
        total = 0.0
        for start in range(0, len(items), BATCH):
            batch = items[start:start + BATCH]
            chunks = model(*chunk_batch)
            queries = model(*model.batch([q for q, _ in batch]))
            sims = queries @ chunks.T
            loss = torch.zeros(())
            answered = [i for i, (_, s) in enumerate(batch) if s is not None]
            if answered:
                mask = torch.zeros(len(answered), len(data.chunks), dtype=torch.bool)
                for row, i in enumerate(answered):
                    mask[row, list(batch[i][1])] = True
                logits = sims[answered] / TEMPERATURE
                positive = torch.logsumexp(logits.masked_fill(~mask, -1e9), dim=1)
                loss = loss + (torch.logsumexp(logits, dim=1) - positive).sum()
            declined = [i for i, (_, s) in enumerate(batch) if s is None]
            if declined:
                worst = sims[declined].max(dim=1).values
                loss = loss + (torch.relu(worst - MARGIN) / TEMPERATURE).sum()
            optimizer.zero_grad()
            (loss / len(batch)).backward()
            optimizer.step()
            total += float(loss.detach())
        if epoch % 10 == 9 or epoch == epochs - 1:
            log(f"epoch {epoch + 1}: loss {total / len(items):.3f}")
    return model.eval()


def validation_points(model: Embedder, data: Data, coverage: dict[str, float]) -> tuple[list, list]:
    """For the kept-out paraphrases, (BM25 coverage, the best chunk's cosine when that chunk
    answers it, else None); for the kept-out unanswerable questions, (coverage, best cosine)."""
    chunks = model.embed(data.chunks)

    def best(question: str) -> tuple[int, float]:
        sims = model.embed([question])[0] @ chunks.T
        return int(sims.argmax()), float(sims.max())

    right = [(coverage[q], s if b in sources else None) for q, sources in data.held for b, s in [best(q)]]
    wrong = [(coverage[q], best(q)[1]) for q in data.held_unanswerable]
    return right, wrong


def choose_thresholds(right: list, wrong: list, log=print) -> tuple[float, float]:
    """(KB_MIN_SIMILARITY, KB_MIN_SCORE): the pair with the best balanced accuracy over the
    kept-out questions, the share of paraphrases let through to a right chunk (their best chunk
    by cosine answers them and clears the first, or BM25's coverage clears the second) plus the
    share of unanswerable questions kept out."""

    def rates(similarity: float, score: float) -> tuple[float, float]:
        through = sum(c >= score or (s is not None and s >= similarity) for c, s in right)
        out = sum(c < score and s < similarity for c, s in wrong)
        return through / max(1, len(right)), out / max(1, len(wrong))

    grid = [(t / 100, c / 10) for t in range(30, 96, 5) for c in range(3, 11)]
    similarity, score = max(grid, key=lambda pair: (round(sum(rates(*pair)), 6), -pair[0], -pair[1]))
    through, out = rates(similarity, score)
    alone = rates(2.0, DEMO_MIN_SCORE)
    log(f"validation ({FOLDS} folds): {len(right)} kept-out paraphrases, {len(wrong)} unanswerable; "
        f"KB_MIN_SIMILARITY {similarity:.2f} with KB_MIN_SCORE {score:.1f}: {through:.1%} through, "
        f"{out:.1%} kept out (BM25 alone at {DEMO_MIN_SCORE}: {alone[0]:.1%} through to any chunk, "
        f"{alone[1]:.1%} kept out)")
    return similarity, score


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.train_embedder")
    parser.add_argument("--out", default=DEMO_EMBEDDER)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    args = parser.parse_args(argv)
    started, rng = time.time(), random.Random(args.seed)
    corpus = gather()
    print(f"{len(corpus.chunks)} chunks, {len(corpus.items)} items, {len(corpus.unanswerable)} "
          f"unanswerable questions; {FOLDS} validation runs")
    right, wrong = [], []
    for fold in range(FOLDS):
        data = split(corpus, fold, rng)
        points = validation_points(train(data, args.seed, args.epochs, log=lambda *_: None), data,
                                   corpus.coverage)
        right += points[0]
        wrong += points[1]
    similarity, score = choose_thresholds(right, wrong)
    model = train(split(corpus, None, rng), args.seed, args.epochs)
    model.config = replace(model.config, min_similarity=similarity, min_score=score)
    model.save(args.out)
    print(f"saved {args.out} (KB_MIN_SIMILARITY {similarity:.2f}, KB_MIN_SCORE {score:.1f}) "
          f"in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
