"""What happens to one accepted message: claim, compose, deliver, finish.

The step order makes a redelivered or retried task safe:

1. claim the outbox row with a lease (nobody else runs it; a dead worker's lease expires);
2. if no reply is stored yet, compose it into a ``Reply`` (``worker.delivery.reply``: over the
   user's rate limit, the polite notice or nothing; else command, welcome, media or the model) and
   store it encrypted *before* sending, so a retry sends the same answer instead of generating
   a new one;
3. deliver it (``worker.delivery``: message/send, each chunk recorded so that a retry resumes
   where it stopped, or the AI bot's stream);
4. mark the row answered (or rate_limited, or failed with a reason after a polite notice).

Then the next queued message of the same user is taken in order, so a burst is answered in the
order it was written and each answer sees the previous one in the conversation.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from datetime import timedelta

from app.aibot.streams import TRUNCATED_NOTICE
from app.audit.chain import EventType
from app.db import utcnow
from app.feedback import sources as answer_sources
from app.kf import rules as kf_rules
from app.kf.messages import CHANNEL as KF
from app.knowledge import modes, prompt
from app.knowledge.audience import Audience
from app.knowledge.prompt import choice_bias
from app.llm import GenerationParams, LLMBackend, LLMError
from app.logging_setup import request_context, sensitive
from app.metrics import counters as metrics
from app.models import MessageStatus
from app.outbox import rows
from app.outbox.rows import ClaimResult
from app.outbox.statements import standalone
from app.services import Services
from app.wecom.messages import KF_EVENT
from app.wecom.splitting import MARKDOWN_LIMIT, TEXT_LIMIT, split_for_wecom
from worker import commands, feedback, retry_policy
from worker.conversation import ConversationStore
from worker.delivery.channels import AIBOT, Deliveries, Delivery
from worker.delivery.reply import FAILURE_NOTICE, Reply
from worker.delivery.stream import DEADLINE
from worker.delivery.stream_writer import fit
from worker.failures import LeaseLost, PermanentFailure, TransientFailure
from worker.kf.channel import KfChannel
from worker.kf.channel import handover as kf_handover
from worker.knowledge import Grounder
from worker.media import file_questions
from worker.media import handler as media
from worker.media.errors import MediaUnavailable
from worker.media.files import FileContexts
from worker.media.prompt import for_estimate, with_files, with_images
from worker.metering import Meter
from worker.scope.audience import Audiences, chat_of
from worker.scope.directory import Directory
from worker.tools.loop import ToolLoop
from worker.user_limit import UserRateLimit

log = logging.getLogger(__name__)
TABLE = rows.TABLE
UNSUPPORTED_NOTICE = ("目前我只能阅读文字消息，请用文字描述你的问题。\n"
                      "I can only read text messages for now; please type your question.")
WELCOME_EVENTS = ("subscribe", "enter_agent")
CONTACT_EVENT = "change_contact"
MAX_DRAIN = 20
QUESTION_TYPES = ("text", "mixed", "voice")  # voice: the AI bot's, WeCom's own transcript


@dataclass(frozen=True)
class Outcome:
    """What the task should do next: nothing, or run again after ``countdown`` seconds."""

    status: str
    countdown: float = 0.0
    reason: str = ""
    # The user's next queued message, when the finish read it (``next_read``): the drain then
    # needs no read of its own.
    next_id: int | None = None
    next_read: bool = False

    @property
    def retry(self) -> bool:
        return self.status in ("wait", "retry")


@dataclass(frozen=True)
class _Answer:
    """What the model said (the think part dropped), the usage columns, and whether the AI
    bot's stream deadline cut it short."""

    text: str
    usage: dict
    cut_short: bool = False

    def reply(self, text: str, sources: tuple = ()) -> Reply:
        """``text`` (the answer as the employee gets it) as the message's ``Reply``."""
        return Reply(text + TRUNCATED_NOTICE if self.cut_short else text, usage=self.usage,
                     sources=sources)


DONE = Outcome("done")
NOT_OURS = Outcome("done", reason="not-ours")
_UNREAD = object()  # the finish did not read the user's next message
DRAINED_REMEMBERED = 4096  # message ids a process answered in a drain, ahead of their own tasks


class _Drained:
    """The messages this process answered in a drain (bounded, oldest forgotten first).

    A drained message's own task still arrives; remembered, it is done without a claim (an
    UPDATE that matches nothing and a read of why, for every message after the first when an
    employee sends several at once). Only a finished row is remembered, so skipping its task
    loses nothing; a task this process never drained for claims as always."""

    def __init__(self, size: int = DRAINED_REMEMBERED):
        self.size = size
        self._ids: OrderedDict[int, bool] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, message_id: int) -> None:
        with self._lock:
            self._ids[message_id] = True
            if len(self._ids) > self.size:
                self._ids.popitem(last=False)

    def take(self, message_id: int) -> bool:
        with self._lock:
            return self._ids.pop(message_id, False)


def _observe_finished(row, status: str) -> None:
    """Count the final status and the time from the callback accepting the message."""
    created = row.created_at
    if created is not None and created.tzinfo is None:
        created = created.replace(tzinfo=utcnow().tzinfo)
    latency = (utcnow() - created).total_seconds() if created else None
    metrics.message_finished(status, latency)
    log.info("message finished message_id=%s status=%s latency_s=%.3f", row.id, status,
             latency or 0.0)


def _model_failure(exc: LLMError) -> Exception:
    """A model error as the processor's failure kind: retry later, or give up with a notice."""
    if exc.transient:
        return TransientFailure(f"model: {exc}")
    return PermanentFailure(f"model: {exc}"[:120])


class _LeaseRenewer:
    """One thread per process that renews the leases of the messages being worked on, each
    every third of its lease. A thread started and joined per message cost the worker more CPU
    than the message's statements; a lease is renewed as before, and one whose row another
    worker took is marked lost."""

    def __init__(self):
        self._cond = threading.Condition()
        self._leases: dict[int, tuple[float, LeaseKeeper]] = {}  # id(keeper) -> (due, keeper)
        self._pid = None

    def add(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use, or a forked child: its own thread
                self._pid = os.getpid()
                self._leases.clear()
                threading.Thread(target=self._run, daemon=True, name="lease-renewer").start()
            self._leases[id(keeper)] = (time.monotonic() + keeper.lease_s / 3, keeper)
            self._cond.notify()

    def remove(self, keeper: LeaseKeeper) -> None:
        with self._cond:
            self._leases.pop(id(keeper), None)
            while keeper._renewing:  # an exit waits for a renewal in flight, as a join did
                self._cond.wait()

    def _run(self):
        pid = os.getpid()
        while True:
            with self._cond:
                if self._pid != pid:
                    return
                now = time.monotonic()
                due = [k for at, k in self._leases.values() if at <= now]
                if not due:
                    nxt = min((at for at, _ in self._leases.values()), default=now + 60)
                    self._cond.wait(max(nxt - now, 0.01))
                    continue
                for keeper in due:
                    keeper._renewing = True
                    self._leases[id(keeper)] = (now + keeper.lease_s / 3, keeper)
            for keeper in due:
                try:
                    keeper.renew()
                finally:
                    with self._cond:
                        keeper._renewing = False
                        if keeper.lost.is_set():
                            self._leases.pop(id(keeper), None)
                        self._cond.notify_all()


_renewer = _LeaseRenewer()


class LeaseKeeper:
    """Renews the row's lease in the background while a long generation runs."""

    def __init__(self, services: Services, message_id: int, owner: str, lease_s: float):
        self.services, self.message_id, self.owner, self.lease_s = services, message_id, owner, lease_s
        self.lost = threading.Event()
        self._renewing = False

    def __enter__(self):
        _renewer.add(self)
        return self

    def __exit__(self, *exc):
        _renewer.remove(self)

    def renew(self):
        try:
            with standalone(self.services.db) as sql:
                if not rows.renew_lease(sql, self.message_id, self.owner, self.lease_s):
                    self.lost.set()
        except Exception:  # noqa: BLE001 - a failed renewal is retried next period
            log.warning("lease renewal failed message_id=%s", self.message_id)

    def check(self):
        if self.lost.is_set():
            raise LeaseLost()


class MessageProcessor:
    """Claims, composes, stores, delivers and finishes one message at a time (``process``).

    Its parts get what they use, never the processor: media, delivery and feedback the services
    and the WeCom client; a command a ``CommandContext`` of the collaborators it may touch.
    """

    def __init__(self, services: Services, llm: LLMBackend | None, wecom, conversations: ConversationStore,
                 llm_factory=None):
        self.services = services
        self.settings = services.settings
        self._llm = llm
        self._llm_factory = llm_factory
        self.wecom = wecom
        self.conversations = conversations
        self._llm_lock = threading.Lock()
        # departments: budgets and the documents' scope, forgotten on WeCom's change events
        self.directory = directory = Directory(services, wecom)
        self.meter = Meter(services, directory)
        self.grounder = Grounder(services, wecom, directory)
        self.audiences = Audiences(services, wecom, directory)  # who reads an answer
        self.user_limit = UserRateLimit(services.redis, *self.settings.user_rate_limit)
        self.files = FileContexts(services.redis, services.cipher, self.settings.conversation_ttl_s)
        self.media = media.MediaHandler(services, wecom, self.files)  # voice, images, files (worker/media/)
        self.kf = KfChannel(services, wecom)  # 微信客服 customers (worker/kf/)
        self.deliveries = Deliveries(services, wecom, self.kf.delivery)
        self.drained = _Drained()
        self.tools = ToolLoop(services, self.meter, directory, wecom)  # MCP tools (worker/tools/)

    @property
    def llm(self) -> LLMBackend:
        if self._llm is None:
            with self._llm_lock:
                if self._llm is None:
                    self._llm = self._llm_factory(self.settings)
        return self._llm

    @property
    def loaded_llm(self) -> LLMBackend | None:
        """The model backend if it is loaded, else None (never loads it: a metrics scrape asks)."""
        return self._llm

    # -- entry point ---------------------------------------------------------------------------
    def process(self, message_id: int) -> Outcome:
        if self.drained.take(message_id):  # answered here in an earlier message's drain
            return NOT_OURS
        claimed = []
        outcome = self._process_one(message_id, claimed)
        if outcome.status != "done" or outcome.reason == "not-ours":
            return outcome
        self._drain_after(message_id, claimed[0].user_hash, outcome)
        return outcome

    def _drain_after(self, message_id: int, user_hash: str, outcome: Outcome) -> None:
        """Answer the user's next queued messages now, in order, while we are here."""
        current = message_id
        for _ in range(MAX_DRAIN):
            if outcome.next_read:  # the finish's statement read it
                nxt = outcome.next_id
            else:
                with self.services.db.reader() as session:  # the claim below decides, in a write
                    nxt = rows.next_pending_of_user(session, user_hash, current)
            if nxt is None:
                return
            outcome = self._process_one(nxt)
            if outcome.status != "done":
                return  # its own task (or the sweeper) takes it from here
            if outcome.reason != "not-ours":  # finished here: its own task has nothing to do
                self.drained.add(nxt)
            current = nxt

    def _process_one(self, message_id: int, claimed: list | None = None) -> Outcome:
        """``claimed``: gets the claimed row (its user's next messages follow without a read)."""
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        lease_s = self.settings.claim_lease_s
        with standalone(self.services.db) as sql:
            claim = rows.claim(sql, message_id, owner, lease_s)
            if claim.result != ClaimResult.CLAIMED:
                return self._not_claimed(message_id, claim)
            row = claim.row  # a plain record of its columns (rows.ClaimedRow), no session's
        if claimed is not None:
            claimed.append(row)

        with (request_context(row.request_id),
              LeaseKeeper(self.services, message_id, owner, lease_s) as lease):
            try:
                after = self._work(row, owner, lease)
                return DONE if after is _UNREAD else Outcome("done", next_id=after, next_read=True)
            except LeaseLost:
                log.warning("lease lost, another worker continues message_id=%s", message_id)
                return NOT_OURS
            except TransientFailure as exc:
                return self._transient(row, owner, exc)
            except PermanentFailure as exc:
                self._fail(row, owner, exc.reason, exc.notify)
                return Outcome("done", reason=exc.reason)

    def _not_claimed(self, message_id: int, claim) -> Outcome:
        if claim.result in (ClaimResult.DONE, ClaimResult.MISSING):
            return NOT_OURS
        # Behind an earlier message of the same user, or leased by a worker that may have died:
        # look again when that can have changed.
        return Outcome("wait", countdown=max(claim.retry_after_s, 0.2), reason=claim.result)

    # -- the work ------------------------------------------------------------------------------
    def _work(self, row, owner: str, lease: LeaseKeeper):
        """The user's next queued message as the finish read it (an id or None), or ``_UNREAD``."""
        cipher = self.services.cipher
        user_id = cipher.decrypt(row.user_enc, TABLE, "user_enc", row.id)
        with sensitive(user_id):
            return self._work_as_user(row, owner, lease, user_id)

    def _work_as_user(self, row, owner: str, lease: LeaseKeeper, user_id: str):
        cipher = self.services.cipher
        channel = self.deliveries.for_row(row)
        if row.reply_enc is None and channel.expired():
            raise PermanentFailure("aibot: stream expired before the answer", notify=False)
        if row.reply_enc is None:
            payload = json.loads(cipher.decrypt(row.payload_enc, TABLE, "payload_enc", row.id))
            with sensitive(payload.get("content")):
                reply = channel.present(self._limited(row) or self._compose(row, user_id, payload, lease,
                                                                            channel))
            if not reply.sends:
                channel.nothing()
                values = {"failure_reason": reply.reason} if reply.reason else {}
                return self._finish(row, owner, reply.status, then_next=True, **values)
            chunks = self._chunks(row, reply.kind, reply.text)
            lease.check()
            self._record_sources(row, reply)
            with standalone(self.services.db) as sql:
                stored = rows.save_progress(
                    sql, row.id, owner,
                    reply_enc=cipher.encrypt(reply.text, TABLE, "reply_enc", row.id),
                    reply_kind=reply.kind, chunks_total=len(chunks), **reply.usage)
            if not stored:
                raise LeaseLost()
            if reply.usage and payload.get("content") is not None:
                self.conversations.append_exchange(self._conversation_key(row, payload), row.id,
                                                   payload["content"], reply.text)
            row.reply_kind, row.chunks_total = reply.kind, len(chunks)
            row.model = reply.usage.get("model") or row.model  # a model answer gets the feedback card
        else:
            reply = Reply.stored(cipher.decrypt(row.reply_enc, TABLE, "reply_enc", row.id), row.reply_kind)
            chunks = self._chunks(row, reply.kind, reply.text)

        finish_values = channel.deliver(row, owner, user_id, reply.kind, chunks, lease)
        if reply.status == MessageStatus.RATE_LIMITED:
            # A stream the callback closed at the deadline says so (its reason wins the column).
            values = {"failure_reason": f"rate limited: over {self.user_limit.describe()}", **finish_values}
            self._finish(row, owner, MessageStatus.RATE_LIMITED, **values)
            self.meter.audit_reply(row, EventType.REPLY_SENT, "rate_limited", chunks=len(chunks),
                                   channel=row.channel)
            return _UNREAD
        after = self._finish(row, owner, MessageStatus.ANSWERED, then_next=True, **finish_values)
        self.meter.audit_reply(row, EventType.REPLY_SENT, "sent", chunks=len(chunks), kind=reply.kind,
                               channel=row.channel)
        channel.delivered(row, user_id)
        return after

    def _record_sources(self, row, reply: Reply) -> None:
        """The passages the answer cites, kept for the 👎 report (``app.feedback.sources``)."""
        if not reply.sources:
            return
        try:
            answer_sources.record(self.services, row.id, reply.sources)
        except Exception:  # noqa: BLE001 - the report misses one answer; the employee does not
            log.warning("answer sources not recorded message_id=%s", row.id)

    def _limited(self, row) -> Reply | None:
        """The polite notice (first time in the window), silence after it, None within the limit.

        Counted per message id, so a retried task never counts its message twice; events
        (entering the app) are not messages and are never limited.
        """
        if row.msg_type == "event":
            return None
        decision = self.user_limit.check(row.user_hash, row.id)
        if decision is None:
            return None
        metrics.USER_RATE_LIMITED.labels(notified=str(decision).lower()).inc()
        log.info("user over the rate limit message_id=%s notified=%s", row.id, decision)
        return Reply.rate_limit_notice() if decision else Reply.silenced()

    @staticmethod
    def _chunks(row, kind: str, reply: str) -> list[str]:
        if row.channel == AIBOT:
            return [fit(reply)]  # one stream, not several messages
        if row.channel == KF:
            return kf_rules.fit_messages(reply)  # at most 5 a customer message
        markdown = kind == "markdown"  # never cut inside a bold, code or link span
        return split_for_wecom(reply, MARKDOWN_LIMIT if markdown else TEXT_LIMIT, markup=markdown)

    def _conversation_key(self, row, payload: dict) -> str:
        """Whose history a message continues: the user's own, or theirs within one group chat.

        A group gets its own history so that nothing said in private reaches the group.
        """
        if payload.get("chat_type") == "group" and payload.get("chat_id"):
            return self.services.blind_index("conversation", f"group:{payload['chat_id']}:{row.user_hash}")
        return row.user_hash

    def _compose(self, row, user_id: str, payload: dict, lease: LeaseKeeper, channel: Delivery) -> Reply:
        """The reply to this message (``Reply.nothing()`` when there is none)."""
        if row.msg_type == "event":
            if row.event in WELCOME_EVENTS and self._welcome_due(row):
                return Reply(self.settings.welcome_message)
            if row.event == feedback.CARD_EVENT and self.tools.enabled:  # a tool's 确认/取消 card?
                decided = self.tools.on_card_event(row, user_id, payload)
                if decided is not None:
                    return decided
            if row.event == feedback.CARD_EVENT:  # a 👍/👎 click: stored, no reply
                feedback.on_card_event(self.services, self.wecom, row, user_id, payload)
            elif row.event == feedback.AIBOT_EVENT and row.channel == AIBOT:  # the AI bot's 👍/👎
                feedback.on_aibot_feedback(self.services, row, user_id, payload)
            elif row.event == CONTACT_EVENT:  # the address book changed: departments asked again
                self._forget_member(payload)
            elif row.event == KF_EVENT:  # 微信客服: the account's new messages become rows
                self.kf.sync(payload)
            return Reply.nothing()
        if row.channel == KF:  # a person serving, the window, "转人工", the kf budget
            held = self.kf.before_answer(row, user_id, payload)
            if held is not None:
                return held
        if media.handles(row, payload):
            conversation = self._conversation_key(row, payload)
            try:
                composed = self.media.compose(row, user_id, payload, lease, channel, conversation)
            except MediaUnavailable as exc:
                raise TransientFailure(str(exc)) from exc
            if isinstance(composed, Reply):
                return composed
            answer = self._generate(row, composed.text, lease, channel, user_id, conversation,
                                    images=composed.images, llm=composed.llm, chat_id=chat_of(payload))
            return composed.reply(answer)
        if row.msg_type not in QUESTION_TYPES:
            return Reply(UNSUPPORTED_NOTICE)
        text = (payload.get("content") or "").strip()
        if not text:
            return Reply.nothing()
        conversation = self._conversation_key(row, payload)
        command = commands.parse(text) if row.channel != KF else None  # employees' commands
        if command is not None:
            name, argument = command
            context = commands.CommandContext(user_id, row.user_hash, argument, services=self.services,
                                              conversations=self.conversations, meter=self.meter,
                                              files=self.files, conversation_key=conversation)
            return Reply(commands.run(name, context))
        if self.tools.enabled and not chat_of(payload):  # 1:1 only: a group would read the asker's data
            tooled = self.tools.respond(row, user_id, text, self.conversations.history(conversation),
                                        lambda: self.llm)
            if tooled is not None:
                return tooled
        return self._generate(row, text, lease, channel, user_id, conversation, chat_id=chat_of(payload))

    def _forget_member(self, payload: dict) -> None:
        """``change_contact``: a member changed (or left); their cached departments go."""
        if payload.get("change_type") not in ("update_user", "delete_user"):
            return
        named = {str(payload.get(k) or "") for k in ("user_id", "new_user_id")}
        for user in (named | {u.lower() for u in named}) - {""}:  # ids are case-blind
            self.directory.forget(rows.user_hash(self.services.blind_index, user))
        log.info("address book change applied change_type=%s", payload.get("change_type"))

    def _welcome_due(self, row) -> bool:
        """Welcome on subscribe, and on entering the app at most once a day."""
        if row.event == "subscribe":
            return True
        try:
            return bool(self.services.redis.set(f"welcome:{row.user_hash}", "1", nx=True, ex=86400))
        except Exception:  # noqa: BLE001 - without Redis, welcoming is harmless
            return True

    def _generate(self, row, text: str, lease: LeaseKeeper, channel: Delivery, user_id: str = "",
                  conversation: str | None = None, images: list[dict] | None = None,
                  llm: LLMBackend | None = None, chat_id: str | None = None) -> Reply:
        """The model's answer (or the knowledge base's "not found", or the budget's notice).
        ``chat_id``: the group chat it is asked in (its members read the answer), None in 1:1.

        The knowledge base and the conversation's files decide what the model is shown
        (``worker.media.file_questions``: a question about a file is answered from it);
        KB_MODE what happens when neither has anything (``app.knowledge.modes``)."""
        history = [{"role": t["role"], "content": t["content"]}
                   for t in self.conversations.history(conversation or row.user_hash)
                   if t.get("ref") != row.id]
        files = [] if images else self.files.files(conversation or row.user_hash)
        # The knowledge base: passages for the prompt, or "not found" without asking the model;
        # what every reader of the answer may see (a group chat's members: worker/scope/audience.py).
        grounding = None
        if not images and self.grounder.wanted(text):
            audience = (Audience.company_wide() if row.channel == KF  # customers: documents for everyone
                        else self.audiences.of(row.user_hash, user_id, chat_id))
            grounding = self.grounder.ground(row.user_hash, user_id, file_questions.kb_question(text, files),
                                             history, audience)
        from_files = file_questions.NOT_ABOUT
        if grounding is not None:
            from_files = file_questions.consider(text, files, grounding.found, self.settings)
            grounding = file_questions.combined(grounding, from_files, text)
            route = modes.route(self.settings.kb_mode, grounding.found)
            if route == modes.DECLINE:
                # No model call; the exchange is still kept, so that a follow-up has its context.
                return Reply(grounding.decline(), usage={"model": "kb-not-found"})
            if route == modes.GENERAL:  # no passage at all: nothing scoped reaches a general answer
                return self._general(row, text, history, files, lease, channel, user_id, llm)
        if grounding is not None and self.settings.kb_passages_in_prompt:
            messages = grounding.messages(self.settings.system_prompt, history)
        else:
            messages = [{"role": "system", "content": self.settings.system_prompt}, *history,
                        {"role": "user", "content": text}]
        # The conversation's files not already among the passages, and the images beside the question.
        messages = with_files(messages, file_questions.unshown(files, from_files),
                              self.settings.file_context_max_chars)
        if images:
            messages[-1] = with_images(messages[-1], images)
        choice = (file_questions.reply_choices(grounding.choices(self.settings), from_files)
                  if grounding is not None else ())
        answer = self._ask_model(row, user_id, messages, choice, lease, channel, llm)
        if isinstance(answer, Reply):
            return answer  # the budget's notice
        if grounding is not None and prompt.is_decline(answer.text):  # the passages do not answer
            if modes.after_model_decline(self.settings.kb_mode) == modes.GENERAL:
                return self._general(row, text, history, files, lease, channel, user_id, llm)
            return Reply(file_questions.decline(grounding, from_files), usage=answer.usage)
        if grounding is None:
            return answer.reply(answer.text)
        cited = prompt.cited_numbers(answer.text, len(grounding.passages))
        # the sources, markdown in the AI bot's stream
        return answer.reply(grounding.cite(answer.text, markdown=channel.streams),
                            sources=tuple(grounding.passages[n - 1] for n in cited))

    def _general(self, row, text: str, history: list[dict], files: list[dict], lease: LeaseKeeper,
                 channel: Delivery, user_id: str, llm: LLMBackend | None) -> Reply:
        """KB_MODE=open with nothing found: the model as a general assistant (the conversation,
        no passage), its answer marked as not from company documents."""
        messages = [{"role": "system", "content": self.settings.system_prompt}, *history,
                    {"role": "user", "content": text}]
        messages = with_files(messages, files, self.settings.file_context_max_chars)
        answer = self._ask_model(row, user_id, messages, (), lease, channel, llm)
        if isinstance(answer, Reply):
            return answer
        return answer.reply(modes.with_general_note(answer.text))

    def _ask_model(self, row, user_id: str, messages: list[dict], choice: tuple[str, ...],
                   lease: LeaseKeeper, channel: Delivery, llm: LLMBackend | None) -> _Answer | Reply:
        """The model's answer, or the budget's notice as a ``Reply``."""
        params = GenerationParams(max_tokens=self.settings.max_new_tokens,
                                  temperature=self.settings.temperature, top_p=self.settings.top_p,
                                  choice=choice, choice_scoring=self.settings.kb_choice_scoring,
                                  choice_bias=choice_bias(self.settings, choice))
        try:
            llm = llm or self.llm  # loaded on first use: a missing model fails here, like a call does
        except LLMError as exc:
            raise _model_failure(exc) from exc
        charge = self.meter.reserve(row, user_id, for_estimate(messages), params.max_tokens,
                                    llm.model_name, choices=params.choice)
        if charge.blocked:  # a customer gets a person, not an employee's budget notice
            return Reply(charge.notice) if row.channel != KF else kf_handover("kf: a budget blocked the call")
        started = time.monotonic()
        try:
            generation = channel.generate(llm, messages, params)
        except LLMError as exc:
            self.meter.release(charge)
            raise _model_failure(exc) from exc
        except BaseException:
            self.meter.release(charge)
            raise
        elapsed = time.monotonic() - started
        self.meter.settle(charge, generation, elapsed)
        metrics.generation(llm.model_name[:64], generation.completion_tokens, elapsed)
        lease.check()
        reply = generation.text.strip()  # the answer alone: a think part never reaches WeCom
        if not reply:
            # Nothing to say (all of max_tokens went on thinking, or the model wrote nothing):
            # the tokens are paid for above; the employee gets the polite failure notice.
            raise PermanentFailure("model: no answer after its thinking" if generation.reasoning
                                   else "model: empty answer")
        usage = {"model": generation.model[:64], "prompt_tokens": generation.prompt_tokens,
                 "completion_tokens": generation.completion_tokens}
        cut_short = generation.finish_reason == DEADLINE
        if cut_short:
            usage["failure_reason"] = "aibot: answer cut short at the stream deadline"
        return _Answer(reply, usage, cut_short)

    # -- endings -------------------------------------------------------------------------------
    def _finish(self, row, owner: str, status: str, then_next: bool = False, **values):
        """``then_next``: the same statement reads the user's next queued message; its id (or
        None) is returned, else ``_UNREAD``."""
        with standalone(self.services.db) as sql:
            if then_next:
                finished, after = rows.finish_then_next(sql, row.id, owner, status, row.user_hash,
                                                        **values)
            else:
                finished, after = rows.finish(sql, row.id, owner, status, **values), _UNREAD
            if not finished:
                raise LeaseLost()
        _observe_finished(row, status)
        return after

    def _transient(self, row, owner: str, failure: TransientFailure) -> Outcome:
        reason = str(failure)
        if row.attempts >= self.settings.task_max_retries:
            self._fail(row, owner, f"gave up after {row.attempts} attempts: {reason}"[:120], True)
            return Outcome("done", reason="failed")
        countdown = retry_policy.countdown(
            row.attempts, rate_limited=failure.rate_limited, retry_after=failure.retry_after,
            rate_limit_base_s=self.settings.wecom_rate_limit_retry_s)
        # The row is due again when the countdown ends: the sweeper, which re-publishes queued
        # rows older than SWEEP_QUEUED_AFTER_S, must not bring it back before that (a rate
        # limit's wait is longer than its 60 s); it stays the backstop if the retry is lost.
        due = rows.utcnow() + timedelta(seconds=countdown)
        with standalone(self.services.db) as sql:
            rows.finish(sql, row.id, owner, MessageStatus.QUEUED, failure_reason=reason[:120],
                          enqueued_at=due)
        log.info("transient failure%s, retry in %.1fs message_id=%s attempt=%s",
                 " (WeCom rate limit)" if failure.rate_limited else "", countdown, row.id,
                 row.attempts)
        return Outcome("retry", countdown=countdown, reason=reason)

    def _fail(self, row, owner: str, reason: str, notify: bool) -> None:
        log.warning("message failed message_id=%s reason=%s", row.id, reason)
        self.deliveries.for_row(row).failed(row, FAILURE_NOTICE if notify else None)
        with standalone(self.services.db) as sql:
            rows.finish(sql, row.id, owner, MessageStatus.FAILED, failure_reason=reason[:120])
        _observe_finished(row, MessageStatus.FAILED)
        self.meter.audit_reply(row, EventType.REPLY_FAILED, "failed", reason=reason[:120])

