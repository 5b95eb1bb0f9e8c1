"""Score the bundled demo model: `python -m demo.eval [--model models/demo]`, and with
`--questions FILE [--json]` its answers through the knowledge base as the worker gives them
(`app/knowledge/evaluate.py`; `demo/eval_sets/new_wordings.jsonl` is a set in
wordings nowhere in the training data, with questions the handbook does not answer;
`eval_sets/dev.jsonl`, in other new wordings, is the one to choose settings on, its out-of-scope
questions near the handbook's topics, so that the first set stays a test). `--documents DIR`
puts DIR's documents in the knowledge base instead of the handbook (`eval_sets/unseen/`: another
company's, written for the evaluation alone).

Greedy answers (through `LLM.generate`, the engine, MTP speculative by default: greedy speculative decoding
gives the same tokens as plain greedy, only faster) to the training questions and to the
held-out paraphrases, scored against the reference answer by
- exact match (after trimming whitespace),
- token F1 (Chinese characters and lower-cased Latin words / numbers as tokens),
- key facts: the numbers, 「app names」 and capitalised Latin words of the reference; the share
  found in the answer, and the share of answers that contain all of them.
"""

from __future__ import annotations

import argparse
import functools
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from demo.corpus import HANDBOOKS, heldout_pairs, load_qa
from demo.grounded import DEMO_EMBEDDER, demo_reading
from demo.train import SYSTEM_PROMPT
from inference.llm import LLM
from inference.sampling_params import SamplingParams

_TOKEN = re.compile(r"[\u4e00-\u9fff]|[A-Za-z]+|\d+")
_FACT = re.compile(r"\d+(?:[:.,]\d+)*|「[^」]+」|\b[A-Z][A-Za-z]{2,}\b")


def tokens(text: str) -> list[str]:
    return [t.lower() for t in _TOKEN.findall(text)]


def token_f1(prediction: str, reference: str) -> float:
    pred, ref = Counter(tokens(prediction)), Counter(tokens(reference))
    overlap = sum((pred & ref).values())
    if not overlap:
        return 0.0
    precision, recall = overlap / sum(pred.values()), overlap / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def key_facts(text: str) -> set[str]:
    return set(_FACT.findall(text))


_SENTENCE_START = re.compile(r"(?:^|[.!?:;。！？：；]\s*|\n\s*[-*]?\s*)([A-Z][A-Za-z]{2,})\b")
_MID_SENTENCE = re.compile(r"(?<=[a-z,] )[A-Z][A-Za-z]{2,}\b")


def reference_facts(answer: str, common_words: set[str], names: set[str] = frozenset()) -> set[str]:
    """``key_facts`` of a reference answer as an answer must hold them: an app's name without the
    corner brackets a reference puts round it (the handbook writes "企业微信打卡" where the
    reference has 「打卡」), less the capitalised words that are only a sentence's first word
    ("The", "You", "Yes", "Besides": capitalised by grammar, not names). Such a word stays a fact
    where it is a name: capitalised mid-sentence in this answer or in ``names`` (words the texts
    capitalise mid-sentence somewhere), and never written in lower case (``common_words``)."""
    starts = set(_SENTENCE_START.findall(answer))
    inside = set(_MID_SENTENCE.findall(answer))
    facts = set()
    for fact in key_facts(answer):
        if fact in starts and fact not in inside and (fact.lower() in common_words or fact not in names):
            continue
        facts.add(fact.strip("「」"))
    return facts


@functools.cache
def _texts() -> tuple[str, ...]:
    return (*(path.read_text(encoding="utf-8") for path, _ in HANDBOOKS), *(item["answer"] for item in load_qa()))


def common_words() -> set[str]:
    """The words the handbooks or the reference answers write in lower case somewhere."""
    return {w for text in _texts() for w in re.findall(r"\b[a-z]{3,}\b", text)}


def capitalised_names() -> set[str]:
    """The words the handbooks or the reference answers capitalise mid-sentence somewhere."""
    return {w for text in _texts() for w in _MID_SENTENCE.findall(text)}


@dataclass
class Score:
    exact: float
    f1: float
    fact_recall: float
    all_facts: float
    count: int

    def line(self, name: str) -> str:
        return (
            f"{name:<10} n={self.count:<4} exact {self.exact:6.1%}  token-F1 {self.f1:6.1%}  "
            f"key facts {self.fact_recall:6.1%}  all facts {self.all_facts:6.1%}"
        )


def score(
    llm: LLM, pairs: list[tuple[str, str]], system: bool, speculative_k: int, desc: str
) -> tuple[Score, list]:
    params = SamplingParams(temperature=0, max_tokens=160)
    exact = f1 = recall = complete = 0.0
    samples = []
    for question, reference in tqdm(pairs, desc=desc, unit="q"):
        messages = [{"role": "user", "content": question}]
        if system:
            messages.insert(0, {"role": "system", "content": SYSTEM_PROMPT})
        answer = llm.generate([messages], params, speculative_k=speculative_k)[0].text.strip()
        exact += answer == reference.strip()
        f1 += token_f1(answer, reference)
        facts = key_facts(reference)
        found = sum(f in answer for f in facts)
        recall += found / len(facts) if facts else 1.0
        complete += found == len(facts)
        samples.append((question, answer, reference))
    n = max(1, len(pairs))
    return Score(exact / n, f1 / n, recall / n, complete / n, len(pairs)), samples


def _spread(items: list, limit: int | None) -> list:
    """`limit` items spread over the whole list (every topic and both languages), or all."""
    if limit is None or limit >= len(items):
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.eval")
    parser.add_argument("--model", default="models/demo")
    parser.add_argument("--system", action="store_true", help="prepend the product's system prompt")
    parser.add_argument(
        "--limit", type=int, default=None, help="score only the first N of each set"
    )
    parser.add_argument("--speculative-k", type=int, default=3, help="0: plain greedy decoding")
    parser.add_argument("--show", type=int, default=3, help="example answers to print per set")
    parser.add_argument("--questions", default=None,
                        help="score this question set through the knowledge base, as the worker answers "
                             "('heldout': the held-out paraphrases, their reference's key facts; several "
                             "sets separated by commas are asked as one)")
    parser.add_argument("--json", action="store_true", help="with --questions: one JSON object per line")
    parser.add_argument("--documents", default=None, metavar="DIR",
                        help="with --questions: the knowledge base holds the documents in DIR (uploaded "
                             "through the real path, visible to everyone) instead of the handbook")
    parser.add_argument("--conversation", type=int, default=0, metavar="N",
                        help="with --questions: also ask them N in a row by one employee (topics changing, "
                             "follow-ups after their questions) and report that beside the fresh figures")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="with --questions: KB_CHUNK_TOKENS (default: what the demo model reads, as make run)")
    parser.add_argument("--min-score", type=float, default=None,
                        help="with --questions: KB_MIN_SCORE (default: the demo model's, as make run)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="with --questions: KB_TOP_K (default: what the demo model reads, as make run)")
    parser.add_argument("--passages", action=argparse.BooleanOptionalAction, default=True,
                        help="with --questions: give the model the passages (--no-passages: the question "
                             "alone, as KB_PASSAGES_IN_PROMPT=false)")
    parser.add_argument("--quoting", action=argparse.BooleanOptionalAction, default=None,
                        help="with --questions: KB_ANSWER_BY_QUOTING (default: the demo model's, as make run; "
                             "--no-quoting: the model writes its reply freely)")
    parser.add_argument("--quote-unit", choices=("passage", "sentence"), default=None,
                        help="with --questions: KB_QUOTE_UNIT (default: the demo model's, as make run)")
    parser.add_argument("--table-headers", action=argparse.BooleanOptionalAction, default=None,
                        help="with --questions: KB_TABLE_HEADERS (default: the demo model's, as make run)")
    parser.add_argument("--choice-scoring", choices=("tokens", "likelihood"), default=None,
                        help="with --questions: KB_CHOICE_SCORING (default: the setting's, as make run)")
    parser.add_argument("--embeddings", default=DEMO_EMBEDDER if Path(DEMO_EMBEDDER).is_dir() else None,
                        help="with --questions: dense retrieval with this embedder, served over HTTP as make run "
                             "serves it (default: models/demo-embed when present; --embeddings '' for BM25 "
                             "alone)")
    parser.add_argument("--min-similarity", type=float, default=None,
                        help="with --questions: KB_MIN_SIMILARITY (default: the demo model's with the demo's "
                             "embedder, as make run; another embedder's training's own)")
    parser.add_argument("--decline-bias", type=float, default=None,
                        help="with --questions: KB_DECLINE_BIAS (default: the demo model's, as make run)")
    parser.add_argument("--rerank-url", default=None,
                        help="with --questions: RERANK_BASE_URL, a /v1 serving /rerank (a cross-encoder decides "
                             "relevance from --min-relevance)")
    parser.add_argument("--rerank-model", default="", help="with --rerank-url: RERANK_MODEL")
    parser.add_argument("--min-relevance", type=float, default=None,
                        help="with --rerank-url: KB_MIN_RELEVANCE (default: the setting's)")
    args = parser.parse_args(argv)
    if args.questions:
        return knowledge_eval(args)

    llm = LLM.from_pretrained(args.model)
    training = [(item["question"], item["answer"]) for item in load_qa()]
    sets = {
        "training": _spread(training, args.limit),
        "held-out": _spread(heldout_pairs(), args.limit),
    }
    started, lines = time.time(), []
    for name, pairs in sets.items():
        result, samples = score(llm, pairs, args.system, args.speculative_k, name)
        lines.append(result.line(name))
        for question, answer, reference in samples[: args.show]:
            print(f"  Q: {question}\n  A: {answer}\n  R: {reference}")
    print(
        f"{args.model} (greedy, system prompt {'on' if args.system else 'off'}, {time.time() - started:.0f} s)"
    )
    print("\n".join(lines))


def heldout_questions() -> list[dict]:
    """The held-out paraphrases as a question set: each must hold its reference's key facts
    (``reference_facts``; items about the handbook only: small talk is not searched, and an
    answer without a number, name or app has nothing to check)."""
    items, common, names = [], common_words(), capitalised_names()
    for item in load_qa():
        facts = sorted(reference_facts(item["answer"], common, names))
        if item["topic"] in ("greeting", "smalltalk") or not facts:
            continue
        items += [{"question": q, "facts": [[f] for f in facts]} for q in item["heldout"]]
    return items


DOCUMENT_TYPES = (".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".docx")


def documents_in(directory: str) -> list[tuple[Path, str]]:
    """The documents of ``directory`` (its files of a type the knowledge base reads, by name) as
    (path, title): a markdown file's title is its first top-level heading, else the file's name."""
    root = Path(directory)
    if not root.is_dir():
        raise SystemExit(f"--documents {directory}: not a directory")
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_file() and p.suffix.lower() in DOCUMENT_TYPES):
        title = path.stem
        if path.suffix.lower() in (".md", ".markdown"):
            heading = next((line[2:].strip() for line in path.read_text(encoding="utf-8").splitlines()
                            if line.startswith("# ")), "")
            title = heading or title
        found.append((path, title))
    if not found:
        raise SystemExit(f"--documents {directory}: no document ({', '.join(DOCUMENT_TYPES)})")
    return found


def knowledge_eval(args) -> None:
    """The `--questions` mode: the worker's retrieval and prompt over the demo handbook (the
    knowledge base lives above the engine, in `app`; this tool uses it, the engine never does)."""
    import json

    from app.knowledge.evaluate import evaluate, load_questions  # noqa: PLC0415
    questions = []
    for name in args.questions.split(","):  # several sets asked as one
        questions += (_spread(heldout_questions(), args.limit) if name == "heldout"
                      else load_questions(name)[: args.limit])
    passages = args.passages
    # the demo model's reading, as make run (the similarity threshold with the demo's embedder
    # only: another embedder keeps the one its training chose), then what the options change
    demo_embedder = bool(args.embeddings) and Path(args.embeddings).resolve() == Path(DEMO_EMBEDDER).resolve()
    reading = demo_reading(dense=demo_embedder)
    options = {"kb_chunk_tokens": args.chunk_tokens, "kb_top_k": args.top_k, "kb_min_score": args.min_score,
               "kb_min_similarity": args.min_similarity, "kb_answer_by_quoting": args.quoting,
               "kb_decline_bias": args.decline_bias, "kb_choice_scoring": args.choice_scoring,
               "rerank_base_url": args.rerank_url, "rerank_model": args.rerank_model or None,
               "kb_min_relevance": args.min_relevance, "kb_quote_unit": args.quote_unit,
               "kb_table_headers": args.table_headers}
    reading.update({name: value for name, value in options.items() if value is not None})
    runs = {"fresh": 0, **({f"conversations of {args.conversation}": args.conversation}
                           if args.conversation else {})}
    handbooks = documents_in(args.documents) if args.documents else HANDBOOKS  # both editions, as make run
    tallies = {name: evaluate(questions, args.model, handbooks, passages, embeddings=args.embeddings or None,
                              conversation=size, **reading)
               for name, size in runs.items()}
    if args.json:
        for name, tally in tallies.items():
            for row in tally.rows:
                print(json.dumps({**row, **({"asked": name} if args.conversation else {})}, ensure_ascii=False))
        summaries = {"summary": tallies["fresh"].summary(),
                     **{f"summary ({name})": t.summary() for name, t in tallies.items() if name != "fresh"}}
        print(json.dumps({**summaries, "model": args.model, "passages_in_prompt": passages,
                          "documents": args.documents or "handbook",
                          "embeddings": args.embeddings or None, **reading}))
        return
    for row in tallies["fresh"].rows[: args.show]:
        print(f"  Q: {row['question']}\n  A: {row['answer']}\n  declined: {row['declined']}")
    for name, tally in tallies.items():
        print(name, json.dumps(tally.summary(), ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
