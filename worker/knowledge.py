"""The knowledge base on the message path: whom the employee is, what they may see, what to say.

``Grounder.ground`` runs before the model is called:

- no documents in the knowledge base (or ``KB_ENABLED=false``), or a greeting/thanks: None, and
  the model answers as it always did;
- otherwise the answer's readers decide which documents are searched: the employee's
  departments (WeCom ``user/get``'s ``department`` list, through ``worker.scope.directory``) in a
  1:1 chat, what every member may see in a group chat (``worker.scope.audience``); a follow-up is searched
  with the previous question, and the result is a ``Grounding``: the passages to put in the
  prompt, or, when none is relevant, the "not found" reply that names the team to ask, sent
  without calling the model (a small model asked anyway would guess). The team is the one that
  owns the topic (``app.knowledge.contacts``: the section of the closest passage, from the
  documents' own contacts), else ``KB_FALLBACK_CONTACT``.

When ``user/get`` fails the employee is treated as a member of no department: only documents
visible to everyone are searched, never more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select

from app.knowledge import prompt
from app.knowledge.audience import Audience
from app.knowledge.retrieval import Passage, Retriever
from app.knowledge.store import topic_contact
from app.metrics import counters as metrics
from app.models import KnowledgeDocument
from worker.scope.directory import Directory

log = logging.getLogger(__name__)
PRESENCE_TTL_S = 10.0


@dataclass
class Grounding:
    question: str
    passages: list[Passage]
    contact: str  # the deployment's (KB_FALLBACK_CONTACT), which the prompt's rules name
    owner: Callable[[], str] | None = None  # the team that owns the topic, looked up for a decline
    keeps_history: bool = True  # False for a model that answers by quoting (prompt.shown_history)

    @property
    def found(self) -> bool:
        return bool(self.passages)

    def decline(self) -> str:
        """"Not found", naming the team that owns the topic. The prompt's rules keep naming the
        deployment's contact: a model's own decline is replaced by this one anyway, and a small
        model trained on one contact is not shown another."""
        return prompt.not_found_reply(self.owner() if self.owner else self.contact)

    def messages(self, system_prompt: str, history: list[dict]) -> list[dict]:
        return prompt.grounded_messages(system_prompt, history if self.keeps_history else [],
                                        self.question, self.passages, self.contact)

    def choices(self, settings) -> tuple[str, ...]:
        """The replies the model may give (KB_ANSWER_BY_QUOTING: a passage quoted whole, or "not
        found"); none when it answers freely."""
        return prompt.reply_choices(settings, self.passages)

    def cite(self, reply: str, markdown: bool = False) -> str:
        """The reply with its sources; the model's "not found" becomes the full decline."""
        if prompt.is_decline(reply):
            return self.decline()
        return prompt.with_sources(reply, self.passages, markdown=markdown)


class Grounder:
    def __init__(self, services, wecom, directory: Directory):
        self.services = services
        self.settings = services.settings
        self.wecom = wecom
        self.directory = directory
        self.retriever = Retriever(services)
        self._present: tuple[float, bool] | None = None

    def has_documents(self) -> bool:
        """Whether any document exists (asked at most every few seconds per process)."""
        now = time.monotonic()
        if self._present is not None and now - self._present[0] < PRESENCE_TTL_S:
            return self._present[1]
        try:
            with self.services.db.reader() as session:
                present = session.scalar(select(KnowledgeDocument.id).limit(1)) is not None
        except Exception:  # noqa: BLE001 - a schema without the knowledge base: answer as before
            log.warning("knowledge base not readable; answering without it")
            present = False
        self._present = (now, present)
        return present

    def departments_of(self, user_hash: str, user_id: str) -> list[int]:
        """The departments whose documents the employee may see (``worker.scope.directory``)."""
        return list(self.directory.member(user_hash, user_id).departments)

    def wanted(self, question: str) -> bool:
        """Whether ``ground`` would search at all (so that nobody's scope is looked up for a
        greeting, or without documents)."""
        return self.settings.kb_enabled and not prompt.is_small_talk(question) and self.has_documents()

    def ground(self, user_hash: str, user_id: str, question: str,
               history: list[dict], audience: Audience | None = None) -> Grounding | None:
        """``audience``: who reads the answer (``worker.scope.audience``); by default the asker alone."""
        if not self.wanted(question):
            return None
        previous = next((t["content"] for t in reversed(history) if t.get("role") == "user"), None)
        if audience is None:
            audience = Audience.member(self.departments_of(user_hash, user_id) if user_id else ())
        result = self.retriever.search(question, audience, previous=previous)
        log.info("knowledge base search found=%s passages=%d", result.found, len(result.passages))
        metrics.KNOWLEDGE_SEARCHES.labels(outcome="found" if result.found else "not_found").inc()
        closest = (result.passages or result.candidates)[:1]
        owner = (lambda: self.team_for(closest[0])) if closest else None
        return Grounding(question, result.passages, prompt.contact_of(self.settings), owner,
                         keeps_history=not prompt.answers_by_quoting(self.settings))

    def team_for(self, passage: Passage) -> str:
        """Who owns ``passage``'s topic (its section's or its document's contact), else
        KB_FALLBACK_CONTACT. The passage is one the asker may see, so is its contact."""
        try:
            return topic_contact(self.services, passage) or prompt.contact_of(self.settings)
        except Exception:  # noqa: BLE001 - a decline still goes out, naming the default team
            log.warning("knowledge base contact not readable; naming the default contact")
            return prompt.contact_of(self.settings)
