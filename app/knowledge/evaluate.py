"""Score the bot's knowledge-base answers on a question set, the way the worker gives them.

`python -m demo.eval --questions FILE [--json]` (the demo model against the demo
handbook) runs this: a throwaway database gets the handbook through the real upload path
(`KnowledgeStore.add`), each question goes through the worker's retrieval and prompt (`Retriever`,
`prompt.grounded_messages` or the question alone when `--no-passages`, `prompt.with_sources`,
the "not found" reply without the model), and the model answers through `app.llm` (the bundled
engine, greedy).

FILE is JSON lines: `question` and either `facts` (a list of lists of alternative strings: an
answer scores when each list has one of its strings in it; `section`, optional, what a right
citation names) or `out_of_scope: true` (scores when declined); `follows`, optional, the
question it follows up ("那北京呢？" after "上海的酒店一晚能报多少？"), asked right before it and not
scored. With `--json` one object per question, `{"question", "answer", "citations",
"declined"}`, then the summary as one object. `--conversation N` asks the questions N in a row
by one employee (topics changing, follow-ups after their questions), as employees do: the
conversation's earlier turns are in each prompt the way the worker keeps them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import random
import re
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app import migrate
from app.config import Settings
from app.db import Database
from app.knowledge import prompt
from app.knowledge.retrieval import Retriever
from app.knowledge.store import KnowledgeStore
from app.llm import GenerationParams, make_backend
from app.services import Services

MARKUP = re.compile(r"\*\*|__|`")
# a space between a Chinese character and a digit or Latin letter (typesetting: "10 日" is "10日")
CJK_GAP = re.compile(r"(?<=[\u4e00-\u9fff])[ \u00a0]+(?=[0-9A-Za-z])|(?<=[0-9A-Za-z%])[ \u00a0]+(?=[\u4e00-\u9fff])")
FALLBACK_CONTACT = "IT服务台（分机 8100）/ the IT help desk (ext. 8100)"


def ephemeral_settings(database_url: str, model_dir: str, passages: bool) -> Settings:
    """Settings for a run that talks to nobody: fresh random secrets, the bundled engine."""
    return Settings(
        wecom_corp_id="ww" + secrets.token_hex(8), wecom_agent_id=1000002, wecom_secret=secrets.token_urlsafe(32),
        wecom_token=secrets.token_urlsafe(24),
        wecom_aes_key=base64.b64encode(secrets.token_bytes(32)).decode().rstrip("="),
        data_keys="k1:" + base64.b64encode(secrets.token_bytes(32)).decode(),
        blind_index_key=secrets.token_urlsafe(48), secret_key=secrets.token_urlsafe(48),
        database_url=database_url, inference_backend="engine", model_dir=model_dir,
        kb_passages_in_prompt=passages, kb_fallback_contact=FALLBACK_CONTACT)


def as_read(text: str) -> str:
    """A text as an employee reads it: markdown's emphasis and code marks are not words
    ("**5** 次" says "5 次"; WeCom's markdown and the AI bot's stream show it so), and the space
    Chinese typesetting puts between a character and a number is not either ("10 日" = "10日")."""
    return CJK_GAP.sub("", MARKUP.sub("", text))


def load_questions(path: str | Path) -> list[dict]:
    items = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        if not isinstance(item.get("question"), str) or not (item.get("facts") or item.get("out_of_scope")):
            raise ValueError(f"{path}:{number}: needs a question and facts or out_of_scope")
        if "follows" in item and not (isinstance(item["follows"], str) and item["follows"].strip()):
            raise ValueError(f"{path}:{number}: follows is the question it follows up")
        items.append(item)
    return items


@dataclass
class Tally:
    answered_facts: int = 0  # in-scope answers holding every fact
    in_scope: int = 0
    wrongly_declined: int = 0
    declined_out: int = 0
    out_of_scope: int = 0
    cited_right: int = 0
    cited_checked: int = 0
    rows: list[dict] = field(default_factory=list)

    def add(self, item: dict, answer: str, citations: list[str], declined: bool) -> None:
        self.rows.append({"question": item["question"], "answer": answer, "citations": citations,
                          "declined": declined})
        if item.get("out_of_scope"):
            self.out_of_scope += 1
            self.declined_out += declined
            return
        self.in_scope += 1
        self.wrongly_declined += declined
        shown = as_read(answer)
        # a decline holds no fact, whatever digits the team it names has ("8100" holds "1" and "10")
        self.answered_facts += not declined and all(any(as_read(s) in shown for s in group)
                                                    for group in item["facts"])
        if item.get("section") and not declined:
            self.cited_checked += 1
            self.cited_right += any(item["section"] in c for c in citations)

    def summary(self) -> dict:
        def share(a: int, b: int) -> float | None:
            return round(a / b, 4) if b else None

        return {"key_facts": share(self.answered_facts, self.in_scope), "in_scope": self.in_scope,
                "wrongly_declined": share(self.wrongly_declined, self.in_scope),
                "declined_out_of_scope": share(self.declined_out, self.out_of_scope),
                "out_of_scope": self.out_of_scope,
                "cited_section_correct": share(self.cited_right, self.cited_checked)}


@contextlib.contextmanager
def scratch_knowledge_base(handbooks: Sequence[tuple[Path, str]], model_dir: str = "",
                           passages: bool = True, embeddings: str | None = None,
                           **overrides) -> Iterator[Services]:
    """Services over a throwaway SQLite database holding ``handbooks`` (path, title), each
    uploaded through the real path; public (visible to everyone). ``overrides``: settings
    (e.g. ``kb_chunk_tokens``). ``embeddings``: an embedder directory (``inference/embedder.py``)
    served over HTTP for the run (``EMBEDDINGS_BASE_URL``), so dense retrieval is on, with the
    thresholds its training chose unless ``overrides`` gives them."""
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        if embeddings:
            from app.llm.served_embeddings import served_embeddings

            overrides = {**stack.enter_context(served_embeddings(embeddings)), **overrides}
        url = f"sqlite:///{Path(scratch) / 'kb.sqlite3'}"
        migrate.upgrade(url)
        db = Database(url)
        try:
            settings = ephemeral_settings(url, model_dir, passages).model_copy(update=overrides)
            services = Services(settings, db)
            for path, title in handbooks:
                KnowledgeStore(services).add(path.read_bytes(), title, filename=path.name)
            yield services
        finally:
            db.dispose()


def evaluate(questions: list[dict], model_dir: str, handbooks: Sequence[tuple[Path, str]],
             passages: bool, max_tokens: int = 160, embeddings: str | None = None,
             conversation: int = 0, **overrides) -> Tally:
    """Every question answered as the worker answers it. ``conversation``: 0 asks each in a fresh
    conversation; N asks them N in a row by one employee (``in_conversations``), each turn seeing
    the ones before as the worker keeps them."""
    with scratch_knowledge_base(handbooks, model_dir, passages, embeddings, **overrides) as services:
        return _answer_all(questions, services, services.settings, max_tokens, conversation)


def in_conversations(questions: list[dict], size: int, seed: int = 7) -> list[list[dict]]:
    """The questions as conversations of ``size`` turns: shuffled with a fixed seed, so topics
    change within one, and each follow-up (an item with ``follows``, the question it follows up)
    right after its own question, which is asked but not scored. ``size`` 0: each question (with
    the one it follows) a conversation of its own."""
    order = list(questions)
    random.Random(seed).shuffle(order)
    conversations, current = [], []
    for item in order:
        turns = ([{"question": item["follows"], "unscored": True}] if item.get("follows") else []) + [item]
        if current and (not size or len(current) + len(turns) > size):
            conversations.append(current)
            current = []
        current += turns
    if current:
        conversations.append(current)
    return conversations


def _answer_all(questions: list[dict], services, settings: Settings, max_tokens: int,
                conversation: int = 0) -> Tally:
    retriever, backend, tally = Retriever(services), make_backend(settings), Tally()
    contact = prompt.contact_of(settings)
    order = in_conversations(questions, conversation) if conversation else [
        ([{"question": item["follows"], "unscored": True}] if item.get("follows") else []) + [item]
        for item in questions]
    try:
        for turns in order:
            history: list[dict] = []
            for item in turns:
                answer, citations, declined = _answer(item["question"], history, retriever, backend,
                                                      settings, contact, max_tokens)
                if not item.get("unscored"):
                    tally.add(item, answer, citations, declined)
                # the conversation as the worker keeps it (worker/conversation.py): the question
                # and the reply the employee got, its sources or its decline included
                history = (history + [{"role": "user", "content": item["question"]},
                                      {"role": "assistant", "content": answer}]
                           )[-settings.conversation_max_messages:]
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return tally


def _answer(question: str, history: list[dict], retriever: Retriever, backend, settings: Settings,
            contact: str, max_tokens: int) -> tuple[str, list[str], bool]:
    """One turn as the worker gives it (worker/knowledge.py, worker/processor.py): searched with
    the conversation's previous question, the passages and the history the prompt shows, the
    model's or retrieval's "not found", the sources."""
    previous = next((t["content"] for t in reversed(history) if t["role"] == "user"), None)
    result = retriever.search(question, [], previous=previous)  # a member of no department
    if not result.found:
        return prompt.not_found_reply(contact), [], True
    if settings.kb_passages_in_prompt:
        messages = prompt.grounded_messages(settings.system_prompt, prompt.shown_history(settings, history),
                                            question, result.passages, contact)
    else:
        messages = [{"role": "system", "content": settings.system_prompt}, *history,
                    {"role": "user", "content": question}]
    choice = prompt.reply_choices(settings, result.passages)
    params = GenerationParams(temperature=0, max_tokens=settings.max_new_tokens if choice else max_tokens,
                              choice=choice, choice_scoring=settings.kb_choice_scoring,
                              choice_bias=prompt.choice_bias(settings, choice))
    text = backend.generate(messages, params).text.strip()
    if prompt.is_decline(text):  # the model's "not found", as the worker sends it
        return prompt.not_found_reply(contact), [], True
    cited = [result.passages[n - 1].source for n in prompt.cited_numbers(text, len(result.passages))]
    return prompt.with_sources(text, result.passages), list(dict.fromkeys(cited)), False
