"""Files first: a question about a file of the conversation is answered from the file.

The knowledge base's "not found" used to answer before the conversation's files were looked at
(the grounding step declined without the model). Now, when the conversation has files
(``worker.media.files``), ``consider`` decides whether the question is about them:

- it **refers** to a file: names it ("policy.pdf", "policy"), or points at one ("这个文件",
  "这份文档里", "上面的 PDF", "the attached file", "in this document"), or asks for a summary
  ("总结一下", "summarize") — with a file in the conversation that is what it means;
- or one of the file's passages is **relevant** by the knowledge base's own measure (coverage
  of the question's weighted words, ``KB_MIN_SCORE``), scored over the file alone
  (``app.knowledge.retrieval.score_texts``);
- or the knowledge base found **nothing** for it: the file is the only thing the employee gave
  us to answer from (the question may still not be about it; then the model says so).

A bare "文件" is not a reference ("报销需要什么文件？" asks the documents); the knowledge base is
searched with the reference taken out ("这个文件讲了什么" searches "讲了什么", which finds
nothing), so the words that point at the file do not pull in passages about files. Measured on
the development questions (none is about a file) and a set of file questions:
``bench/file_questions.py``.

The file's text is offered as passages the answer cites by the file's name: for a model that
writes its answer, each file whole (it can summarise it); for a model that answers by quoting
(``KB_ANSWER_BY_QUOTING``, the demo), the file's chunks (cut as the knowledge base cuts
documents) best-scored first, its beginning when none scores, each quotable. With the knowledge
base's passages when both are relevant. A question that refers to a file is never answered with
the knowledge base's decline: a quoting model is not offered "not found", and a writing model's
own "not found" names the file.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from app.knowledge import prompt
from app.knowledge.chunking import chunk_blocks
from app.knowledge.parsing import parse_markdown
from app.knowledge.retrieval import Passage, score_texts

FILE_DOCUMENT = 0  # a file's passages carry this document id (the knowledge base's start at 1)
_NOUN = r"(?:文件|文档|附件|pdf|word|docx|txt|材料|资料|报告|合同|表格|这份东西)"
_ZH_REFERENCE = re.compile(
    r"(?:这|那|该|此|本|上面的?|上述|以上|刚才的?|刚刚的?|前面的?|我发的?|我刚发的?|发给你的?|你读的?|你看的?|附上的?)"
    r"\s*(?:一)?(?:个|份|篇|张|页)?\s*" + _NOUN + r"(?:里面|里|中|内)?"
    + r"|" + r"(?:文件|文档|附件|pdf)\s*(?:里面|里|中|内)"
    + r"|总结一下|总结下|概括一下|概括下|摘要|归纳一下", re.I)
_EN_REFERENCE = re.compile(
    r"\b(?:this|that|the|my|attached|uploaded|above|your)\s+(?:file|document|doc|pdf|attachment|report)s?\b"
    r"|\bthe\s+attachment\b|\bsummari[sz]e\b|\bsummary\b|\btl;?dr\b", re.I)


@dataclass(frozen=True)
class FileAnswer:
    """What the conversation's files add to one question: the passages to show (none: the
    question is not about them) and whether it refers to a file itself."""

    passages: tuple[Passage, ...] = ()
    refers: bool = False

    @property
    def about(self) -> bool:
        return bool(self.passages)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.title for p in self.passages))


NOT_ABOUT = FileAnswer()


def _named(question: str, files: list[dict]) -> list[dict]:
    """The files whose name (or name without its extension, 3+ characters) the question holds."""
    lowered = question.lower()
    named = []
    for f in files:
        name = (f.get("name") or "").strip().lower()
        stem = name.rsplit(".", 1)[0]
        if name and (name in lowered or (len(stem) >= 3 and stem in lowered)):
            named.append(f)
    return named


def refers_to_file(question: str, files: list[dict]) -> bool:
    """Whether the question names or points at a file (only asked when the conversation has one)."""
    return bool(files) and bool(_ZH_REFERENCE.search(question) or _EN_REFERENCE.search(question)
                                or _named(question, files))


def kb_question(question: str, files: list[dict]) -> str:
    """What the knowledge base is searched with: the question without its reference to a file."""
    if not files or not refers_to_file(question, files):
        return question
    rest = question
    for f in _named(question, files):  # the name first: "policy.pdf 里" is not "pdf 里"
        name = f.get("name") or ""
        rest = re.sub(f"(?:{re.escape(name)}|{re.escape(name.rsplit('.', 1)[0])})\\s*(?:里面|里|中|内)?",
                      " ", rest, flags=re.I)
    rest = _EN_REFERENCE.sub(" ", _ZH_REFERENCE.sub(" ", rest))
    return re.sub(r"\s+", " ", rest).strip()


def _chunks_of(f: dict, max_tokens: int) -> list[Passage]:
    blocks = parse_markdown(f.get("text") or "")
    return [Passage(chunk_id=-(i + 1), document_id=FILE_DOCUMENT, title=f["name"], section=c.section,
                    text=c.text, score=0.0, coverage=0.0)
            for i, c in enumerate(chunk_blocks(blocks, max_tokens))] if blocks else []


def _whole(f: dict) -> Passage:
    return Passage(chunk_id=-1, document_id=FILE_DOCUMENT, title=f["name"], section="",
                   text=f.get("text") or "", score=0.0, coverage=1.0)


def consider(question: str, files: list[dict], kb_found: bool, settings) -> FileAnswer:
    """Whether ``question`` is about the conversation's ``files``, and their passages if so."""
    if not files:
        return NOT_ABOUT
    refers = refers_to_file(question, files)
    chosen = _named(question, files) or files
    chunks = [p for f in reversed(chosen) for p in _chunks_of(f, settings.kb_chunk_tokens)]  # newest first
    for passage, (score, coverage) in zip(chunks, score_texts(question, [p.text for p in chunks]),
                                          strict=True):
        passage.score, passage.coverage = score, coverage
    relevant = [p for p in chunks if p.coverage >= settings.kb_min_score]
    if not (refers or relevant or not kb_found):
        return NOT_ABOUT
    if not prompt.answers_by_quoting(settings):
        return FileAnswer(tuple(_whole(f) for f in reversed(chosen)), refers)
    ranked = sorted(chunks, key=lambda p: (-p.coverage, -p.score)) if relevant else chunks  # else its beginning
    return FileAnswer(tuple(ranked[:settings.kb_top_k]), refers)


def combined(grounding, answer: FileAnswer, question: str):
    """``grounding`` (``worker.knowledge.Grounding``) with the files' passages: first when the
    question refers to a file, after the knowledge base's otherwise; asked as ``question``
    (the grounding was searched with ``kb_question``)."""
    if not answer.about:
        return dataclasses.replace(grounding, question=question)
    passages = ([*answer.passages, *grounding.passages] if answer.refers
                else [*grounding.passages, *answer.passages])
    return dataclasses.replace(grounding, question=question, passages=passages)


def reply_choices(choices: tuple[str, ...], answer: FileAnswer) -> tuple[str, ...]:
    """A quoting model's choices: without "not found" when the question refers to a file."""
    if not answer.refers:
        return choices
    kept = tuple(c for c in choices if c not in (prompt.NOT_FOUND_ZH, prompt.NOT_FOUND_EN))
    return kept or choices


def decline(grounding, answer: FileAnswer) -> str:
    """The model's "not found" as the employee gets it: naming the files it looked in."""
    if not answer.about:
        return grounding.decline()
    names = "、".join(f"《{n}》" for n in answer.names)
    english = ", ".join(f'"{n}"' for n in answer.names)
    team = grounding.owner() if grounding.owner else grounding.contact
    return (f"抱歉，我在{names}和知识库里都没有找到这个问题的答案，请联系{team}。\n"
            f"Sorry, I could not find this in {english} or the knowledge base. Please ask {team}.")


def unshown(files: list[dict], answer: FileAnswer) -> list[dict]:
    """The files that are not among the passages (still given to the model as context)."""
    shown = set(answer.names)
    return [f for f in files if f.get("name") not in shown]
