"""Knowledge base: indexing speed, retrieval latency at 1k/10k/100k chunks, recall on the demo.

``python -m bench.kb [--sizes 1000,10000,100000] [--dbs sqlite,postgresql] [--queries 200]
[--recall-only] [--embeddings models/demo-embed]``

For each database and size, a fresh database (a SQLite file; a throwaway PostgreSQL database
at ``BENCH_PG``, default the local server) is migrated and filled with synthetic documents of
100 chunks, generated from the demo corpus' own words (jieba words of the handbook and the Q&A,
drawn with their frequencies, Chinese and English mixed as the handbook is), 10 % of them
visible to one of ten departments; the handbook itself is added too. Indexing runs the real
path (chunking, segmentation, term hashing, sealing, the transaction): chunks per second.
Retrieval times ``Retriever.search`` (visibility filter, postings, BM25, decrypting the top
passages) for the demo's questions asked as a member of department 3: p50 and p95.

Recall@5 uses the handbook alone: for each held-out paraphrase (``heldout_pairs``, greetings and
small talk left out) the gold passage is the one the item's English answer retrieves first (the
handbook is written in English with Chinese names; the Chinese answers are translations), and a
hit is gold among the five best. It also reports, at ``KB_MIN_SCORE``, how many of those
questions are answered (not declined) and how many of a list of questions the handbook does not
answer are declined. ``--embeddings DIR`` does the recall with dense retrieval too (the demo's
embedder served as ``make run`` serves it; its thresholds), the sweep still over coverage.

``--facts SETS [--top-ks 3,5,8] [--conversation N] [--documents DIR] [--table-headers]``: instead,
for each set (``heldout`` or a question file) the share of questions for which a passage among the
k best, and among those the thresholds give the model, holds every fact of the question
(``facts_recall``; docs/retrieval.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
import uuid
from collections import Counter

from app import migrate
from app.db import Database
from app.knowledge.parsing import Block, Parsed
from app.knowledge.retrieval import Retriever
from app.knowledge.store import KnowledgeStore
from app.knowledge.terms import terms
from app.services import Services
from demo.corpus import COMPANY_PATH, load_qa
from inference.server.embeddings import served_settings
from tests.support.env import make_env, settings_from

PG_SERVER = os.environ.get("BENCH_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CHUNKS_PER_DOC = 100
OUT_OF_SCOPE = [
    "can I bring my dog to the office?", "公司股票期权怎么行权", "明天上海天气怎么样", "食堂周五有火锅吗",
    "how do I apply for a patent?", "公司年会在哪里举办", "我可以在工位养猫吗", "What is the CEO's name?",
    "怎么申请公司宿舍", "公司给家属报销健身房会员吗", "Is there a company choir?", "怎么修改工资卡开户行",
    "What programming language should I learn?", "推荐一家附近好吃的川菜馆", "how do I file my personal taxes?",
    "公司明年上市吗", "who won the football match last night?", "帮我写一首关于春天的诗",
    "what is the stock price today?", "电梯坏了找谁修", "can I sublet my desk?", "公司有托儿所吗",
    "how do I get a company credit card?", "团建预算是多少", "does the company sponsor MBA degrees?",
    "怎么申请专利奖金", "is there a nap room?", "公司有班车去杭州吗", "can I work from Bali for a month?",
    "年终奖什么时候发",
]


def words_of_corpus() -> tuple[list[str], list[int]]:
    text = COMPANY_PATH.read_text(encoding="utf-8")
    for item in load_qa():
        text += "\n" + item["question"] + "\n" + item["answer"]
    counts = Counter(t for t in terms(text) if not t.startswith("~"))
    words = list(counts)
    return words, [counts[w] for w in words]


def synthetic_parsed(rng: random.Random, words, weights, n_chunks: int) -> Parsed:
    blocks = []
    for i in range(n_chunks):
        blocks.append(Block(f"Section {i} " + " ".join(rng.choices(words, weights, k=3)), 2))
        picked = rng.choices(words, weights, k=rng.randint(50, 90))
        blocks.append(Block("".join(w if not w.isascii() else f" {w} " for w in picked).strip()))
    return Parsed("markdown", blocks)


def fresh_database(kind: str, tmp: str):
    if kind == "sqlite":
        url = f"sqlite:///{tmp}/kb-{uuid.uuid4().hex[:8]}.sqlite3"
        migrate.upgrade(url)
        return url, lambda: None
    import sqlalchemy as sa

    name = f"bench_kb_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = PG_SERVER.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)

    def drop():
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return url, drop


def services_for(url: str, **overrides) -> Services:
    env = make_env(DATABASE_URL=url, **overrides)
    return Services(settings_from(env), Database(url))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_size(kind: str, size: int, queries: list[str], tmp: str) -> dict:
    url, drop = fresh_database(kind, tmp)
    try:
        services = services_for(url)
        store = KnowledgeStore(services)
        store.add(COMPANY_PATH.read_bytes(), "Handbook", filename="company.md")
        rng = random.Random(size)
        words, weights = words_of_corpus()
        n_docs = max(1, size // CHUNKS_PER_DOC)
        started = time.perf_counter()
        chunks = 0
        for d in range(n_docs):
            parsed = synthetic_parsed(rng, words, weights, CHUNKS_PER_DOC)
            prepared = store.prepare_parsed(parsed)
            departments = [d % 10 + 1] if d % 10 == 0 else []
            store.write(prepared, f"doc {d}", departments=departments, audit=False)
            chunks += len(prepared.chunks)
        index_s = time.perf_counter() - started
        if kind == "postgresql":
            with services.db.engine.connect() as conn:
                conn.exec_driver_sql("ANALYZE")
                conn.commit()
        retriever = Retriever(services)
        for q in queries[:20]:  # warm caches
            retriever.search(q, [3])
        times = []
        for q in queries:
            t = time.perf_counter()
            retriever.search(q, [3])
            times.append((time.perf_counter() - t) * 1000)
        services.db.dispose()
        return {"db": kind, "chunks": chunks, "index_chunks_per_s": chunks / index_s,
                "p50_ms": statistics.median(times), "p95_ms": percentile(times, 0.95),
                "queries": len(times)}
    finally:
        drop()


def recall(tmp: str, embeddings: str | None = None) -> dict:
    """``embeddings``: an embedder directory, served over HTTP for the run (dense retrieval fused
    with BM25, with the thresholds its training chose)."""
    url, drop = fresh_database("sqlite", tmp)
    with contextlib.ExitStack() as stack:
        overrides = {}
        if embeddings:
            served = stack.enter_context(served_settings(embeddings))
            overrides = {name.upper(): str(value) for name, value in served.items()}
        return _recall(url, drop, overrides)


def _recall(url: str, drop, overrides: dict) -> dict:
    try:
        services = services_for(url, **overrides)
        KnowledgeStore(services).add(COMPANY_PATH.read_bytes(), "Handbook", filename="company.md")
        retriever = Retriever(services)
        qa = load_qa()
        slug = lambda item: item["id"].rsplit("-", 1)[0]  # noqa: E731
        english = {slug(i): i["answer"] for i in qa if i["lang"] == "en"}
        hits = total = answered = 0
        in_scope: list[float] = []  # the best passage's coverage, per held-out question
        for item in qa:
            if item["topic"] in ("greeting", "smalltalk"):
                continue
            gold = retriever.search(english.get(slug(item), item["answer"]), [], top_k=1,
                                    min_score=0).candidates
            if not gold:
                continue
            for question in item["heldout"]:
                result = retriever.search(question, [], top_k=5, min_score=0)
                total += 1
                hits += gold[0].chunk_id in [p.chunk_id for p in result.candidates]
                answered += retriever.search(question, []).found
                in_scope.append(max((p.coverage for p in result.candidates), default=0.0))
        declined = sum(not retriever.search(q, []).found for q in OUT_OF_SCOPE)
        out_scope = [max((p.coverage for p in retriever.search(q, [], min_score=0).candidates),
                         default=0.0) for q in OUT_OF_SCOPE]
        sweep = {t: (sum(c >= t for c in in_scope) / len(in_scope),
                     sum(c < t for c in out_scope) / len(out_scope))
                 for t in (0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5)}
        return {"recall_at_5": hits / total, "questions": total, "answered": answered / total,
                "out_of_scope_declined": declined / len(OUT_OF_SCOPE),
                "out_of_scope": len(OUT_OF_SCOPE), "min_score": services.settings.kb_min_score,
                "min_similarity": services.settings.kb_min_similarity,
                "sweep": sweep}
    finally:
        drop()


def _shown(passage) -> str:
    from app.knowledge.evaluate import as_read  # noqa: PLC0415

    return as_read(f"{passage.section}\n{passage.text}")


def holds(texts: list[str], facts: list[list[str]]) -> bool:
    """Whether ``texts`` together hold every fact of an item (each group's one alternative or
    another), as an employee reads them (``as_read``)."""
    from app.knowledge.evaluate import as_read  # noqa: PLC0415

    return all(any(as_read(s) in t for t in texts for s in group) for group in facts)


def facts_recall(questions: list[dict], top_ks: list[int], embeddings: str | None = None,
                 conversation: int = 0, documents=None,
                 table_headers: bool | None = None) -> dict[int, dict[str, float]]:
    """For each k, over the in-scope ``questions`` (both handbook editions, as ``make run``
    uploads them; the demo's reading, its thresholds applied): ``one``, the share for which one
    of the passages the worker gives the model at ``KB_TOP_K`` k holds every fact; ``together``,
    those passages together; ``ceiling``, the share that one chunk of the knowledge base could
    hold at all (the rest need two places: a section's rule and section 1's contacts);
    ``ranked``, the share for which one of the k best passages holds every fact, thresholds not
    applied (the ranking's part alone: what an answered question is given), and
    ``ranked_together``, those k together.
    ``conversation`` N: asked N in a row by one employee, each searched with the previous
    question as the worker searches it (``app.knowledge.evaluate.in_conversations``).
    ``documents``: (path, title) pairs instead of the handbook (``demo.eval.documents_in``);
    ``table_headers``: ``KB_TABLE_HEADERS`` instead of the demo's (off: its model's)."""
    from app.knowledge.evaluate import in_conversations, scratch_knowledge_base  # noqa: PLC0415
    from demo.corpus import HANDBOOKS  # noqa: PLC0415
    from demo.grounded import DEMO_EMBEDDER, demo_reading  # noqa: PLC0415

    demo_embedder = bool(embeddings) and os.path.realpath(embeddings) == os.path.realpath(DEMO_EMBEDDER)
    reading = demo_reading(dense=demo_embedder)
    if table_headers is not None:
        reading["kb_table_headers"] = table_headers
    scored = [q for q in questions if q.get("facts")]
    order = in_conversations(scored, conversation) if conversation else [
        ([{"question": q["follows"], "unscored": True}] if q.get("follows") else []) + [q] for q in scored]
    tally = {k: Counter() for k in top_ks}
    with scratch_knowledge_base(documents or HANDBOOKS, embeddings=embeddings, **reading) as services:
        retriever = Retriever(services)
        chunks = _all_chunks(retriever)
        for turns in order:
            previous = None
            for item in turns:
                if not item.get("unscored"):
                    ceiling = any(holds([c], item["facts"]) for c in chunks)
                    for k in top_ks:
                        result = retriever.search(item["question"], [], previous=previous, top_k=k)
                        shown = [_shown(p) for p in result.passages]
                        tally[k]["one"] += any(holds([t], item["facts"]) for t in shown)
                        tally[k]["together"] += holds(shown, item["facts"])
                        tally[k]["ceiling"] += ceiling
                        ranked = retriever.search(item["question"], [], previous=previous, top_k=k,
                                                  min_score=0)
                        best = [_shown(p) for p in ranked.passages]
                        tally[k]["ranked"] += any(holds([t], item["facts"]) for t in best)
                        tally[k]["ranked_together"] += holds(best, item["facts"])
                previous = item["question"]
    return {k: {name: tally[k][name] / len(scored) for name in ("ranked", "ranked_together", "one", "together", "ceiling")}
            for k in top_ks}


def _all_chunks(retriever: Retriever) -> list[str]:
    """Every chunk of the knowledge base as an employee reads it."""
    from sqlalchemy import select  # noqa: PLC0415

    from app.models import KnowledgeChunk  # noqa: PLC0415

    with retriever.services.db.reader() as session:
        ids = list(session.scalars(select(KnowledgeChunk.id)))
        zero = dict.fromkeys(ids, 0.0)
        return [_shown(p) for p in retriever._passages(session, ids, zero, zero)]


def question_set(name: str) -> list[dict]:
    """``heldout`` (the held-out paraphrases with their reference's facts) or a question file."""
    if name == "heldout":
        from demo.eval import heldout_questions  # noqa: PLC0415

        return heldout_questions()
    from app.knowledge.evaluate import load_questions  # noqa: PLC0415

    return load_questions(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dbs", default="sqlite,postgresql")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--recall-only", action="store_true", help="skip the latency tables")
    parser.add_argument("--embeddings", default=None,
                        help="recall with dense retrieval too: this embedder (e.g. models/demo-embed) "
                             "served over HTTP, with its thresholds")
    parser.add_argument("--facts", default=None, metavar="SETS",
                        help="only the facts recall: 'heldout' or question files (e.g. "
                             "demo/eval_sets/dev.jsonl, the set to tune on), separated by commas")
    parser.add_argument("--top-ks", default="3,5,8", help="with --facts: the KB_TOP_K values")
    parser.add_argument("--conversation", type=int, default=0, metavar="N",
                        help="with --facts: the questions asked N in a row too")
    parser.add_argument("--documents", default=None, metavar="DIR",
                        help="with --facts: the documents in DIR instead of the handbook")
    parser.add_argument("--table-headers", action=argparse.BooleanOptionalAction, default=None,
                        help="with --facts: KB_TABLE_HEADERS (default: the demo's reading, off)")
    args = parser.parse_args()
    if args.facts:
        ks = [int(k) for k in args.top_ks.split(",")]
        documents = None
        if args.documents:
            from demo.eval import documents_in  # noqa: PLC0415

            documents = documents_in(args.documents)
        for name in args.facts.split(","):
            questions = question_set(name)
            for size in [0] + ([args.conversation] if args.conversation else []):
                shares = facts_recall(questions, ks, args.embeddings, size, documents, args.table_headers)
                asked = f"conversations of {size}" if size else "fresh"
                print(f"{name} ({asked}, {sum(1 for q in questions if q.get('facts'))} questions"
                      f"{', dense ' + args.embeddings if args.embeddings else ', lexical'}; one chunk "
                      f"could hold every fact for {shares[ks[0]]['ceiling']:.1%}): a passage holding every "
                      "fact among the k best (the k together) / among those given to the model, thresholds "
                      "applied (together): " + ", ".join(
                          f"k={k} {v['ranked']:.1%} ({v['ranked_together']:.1%}) / {v['one']:.1%} "
                          f"({v['together']:.1%})" for k, v in shares.items()),
                      flush=True)
        return
    rng = random.Random(7)
    questions = [item["question"] for item in load_qa()]
    queries = rng.sample(questions, min(args.queries, len(questions)))
    with tempfile.TemporaryDirectory() as tmp:
        r = recall(tmp, args.embeddings)
        dense = f" with {args.embeddings} (KB_MIN_SIMILARITY {r['min_similarity']})" if args.embeddings else ""
        print(f"recall@5 on the held-out paraphrases{dense}: {r['recall_at_5']:.1%} of {r['questions']}; "
              f"at KB_MIN_SCORE {r['min_score']}: {r['answered']:.1%} answered, "
              f"{r['out_of_scope_declined']:.1%} of {r['out_of_scope']} out-of-scope declined",
              flush=True)
        print("KB_MIN_SCORE sweep (held-out answered / out-of-scope declined): " + ", ".join(
            f"{t}: {a:.0%}/{d:.0%}" for t, (a, d) in r["sweep"].items()), flush=True)
        if args.recall_only:
            return
        print(f"{'db':<11} {'chunks':>8} {'index chunks/s':>15} {'p50 ms':>8} {'p95 ms':>8}", flush=True)
        for kind in args.dbs.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                row = bench_size(kind, size, queries, tmp)
                print(f"{row['db']:<11} {row['chunks']:>8} {row['index_chunks_per_s']:>15.0f} "
                      f"{row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
