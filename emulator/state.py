"""Everything the emulator remembers, behind one lock.

Access tokens, the fault queues, what the bot sent (``messages``), what the users said
(``inbound``), every callback attempt, and counters. Stored items are capped (``max_items``) so a
long demo or a load test cannot grow memory without bound. Sequence numbers and msgids keep
increasing across ``reset()`` so a poller using ``since=`` never misses or repeats an item.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections import OrderedDict, deque
from dataclasses import asdict, dataclass

from emulator import rendering
from emulator.chats import GroupChats
from emulator.config import EmulatorConfig

FAULT_APIS = ("gettoken", "message/send", "user/get", "department/list", "department/get", "media/get",
              "message/update_template_card", "appchat/get", "kf/sync_msg", "kf/send_msg",
              "kf/service_state/get", "kf/service_state/trans",
              "auth/getuserinfo")
_MAX_TOKENS = 1000


@dataclass
class Fault:
    """One queued failure: sleep ``delay`` seconds, then answer ``http_status`` or ``errcode``.

    A delay alone answers normally afterwards, like a WeCom that is slow but still does the work:
    the client has given up, yet the message is delivered.
    """

    errcode: int | None = None
    errmsg: str | None = None
    http_status: int | None = None
    delay: float = 0.0

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, 0.0)}


class EmulatorState:
    def __init__(self, config: EmulatorConfig, clock=time.monotonic, wall=time.time):
        self.config = config
        self.directory = config.directory
        self.chats = GroupChats(self.directory)  # set-up like the directory: reset() keeps them
        self.clock = clock  # token expiry, duplicate windows
        self.wall = wall  # CreateTime, timestamps shown to the app
        self.lock = threading.RLock()
        self.stopping = threading.Event()
        self._seq = 0
        self._msgid = 0
        self._delivery = 0
        self._tokens: OrderedDict[str, float] = OrderedDict()  # token -> expires at (clock)
        self.reset(tokens=True)

    # -- lifecycle ----------------------------------------------------------------------------
    def reset(self, tokens: bool = False) -> None:
        """Forget recorded traffic, faults and counters; tokens survive unless asked."""
        cap = self.config.max_items
        with self.lock:
            self.faults: dict[str, deque[Fault]] = {api: deque() for api in FAULT_APIS}
            self.messages: deque[dict] = deque(maxlen=cap)
            self.inbound: deque[dict] = deque(maxlen=cap)
            self.callbacks: deque[dict] = deque(maxlen=cap)
            self.deliveries: OrderedDict[int, dict] = OrderedDict()
            # AI bot conversations by delivery id: the stream each message got and its refreshes
            self.aibot: OrderedDict[int, dict] = OrderedDict()
            self._duplicates: OrderedDict[tuple[str, str], float] = OrderedDict()
            # template cards: response_code -> the card message (seq) it may update once
            self.response_codes: OrderedDict[str, dict] = OrderedDict()
            self.stats: dict[str, dict] = {}
            if tokens:
                self._tokens.clear()

    def next_seq(self) -> int:
        with self.lock:
            self._seq += 1
            return self._seq

    def next_msgid(self) -> int:
        """A 64-bit-looking MsgId for inbound messages, increasing like WeCom's."""
        with self.lock:
            if not self._msgid:
                self._msgid = 7_200_000_000_000_000_000 + secrets.randbelow(10**15)
            self._msgid += 1 + secrets.randbelow(1000)
            return self._msgid

    def next_delivery_id(self) -> int:
        with self.lock:
            self._delivery += 1
            return self._delivery

    # -- access tokens ------------------------------------------------------------------------
    def issue_token(self) -> tuple[str, int]:
        """A token and its remaining lifetime in whole seconds."""
        now = self.clock()
        with self.lock:
            if self.config.token_reuse:
                for token, expires_at in reversed(self._tokens.items()):
                    if expires_at > now + 1:
                        return token, int(expires_at - now)
                    break
            token = secrets.token_urlsafe(96)
            self._tokens[token] = now + self.config.token_ttl
            while len(self._tokens) > _MAX_TOKENS:
                self._tokens.popitem(last=False)
            return token, int(self.config.token_ttl)

    def check_token(self, token: str | None) -> int:
        """0, or the errcode WeCom answers: 41001 missing, 40014 invalid, 42001 expired."""
        if not token:
            return 41001
        with self.lock:
            expires_at = self._tokens.get(token)
        if expires_at is None:
            return 40014
        return 42001 if self.clock() >= expires_at else 0

    def expire_tokens(self, token: str | None = None) -> int:
        """Expire one token or all of them now (WeCom may invalidate tokens early)."""
        now = self.clock()
        with self.lock:
            targets = [token] if token else list(self._tokens)
            count = 0
            for t in targets:
                if t in self._tokens:
                    self._tokens[t] = now
                    count += 1
            return count

    # -- faults -------------------------------------------------------------------------------
    def push_fault(self, api: str, fault: Fault, count: int = 1) -> None:
        with self.lock:
            self.faults[api].extend(Fault(**asdict(fault)) for _ in range(count))

    def pop_fault(self, api: str) -> Fault | None:
        with self.lock:
            queue = self.faults.get(api)
            return queue.popleft() if queue else None

    def pending_faults(self) -> dict[str, list[dict]]:
        with self.lock:
            return {api: [f.to_json() for f in q] for api, q in self.faults.items()}

    def clear_faults(self, api: str | None = None) -> None:
        with self.lock:
            for name, queue in self.faults.items():
                if api in (None, name):
                    queue.clear()

    # -- stats --------------------------------------------------------------------------------
    def count(self, api: str, errcode: int | None = None, http_status: int | None = None) -> None:
        """One call answered: by an errcode (HTTP 200) or by a bare HTTP status."""
        with self.lock:
            entry = self._entry(api)
            entry["calls"] += 1
            if errcode is not None:
                entry["errcode"][str(errcode)] = entry["errcode"].get(str(errcode), 0) + 1
            if http_status is not None:
                key = str(http_status)
                entry["http_status"][key] = entry["http_status"].get(key, 0) + 1

    def bump(self, api: str, name: str, n: int = 1) -> None:
        with self.lock:
            entry = self._entry(api)
            entry[name] = entry.get(name, 0) + n

    def _entry(self, api: str) -> dict:
        return self.stats.setdefault(api, {"calls": 0, "errcode": {}, "http_status": {}})

    def snapshot_stats(self) -> dict:
        with self.lock:
            return json.loads(json.dumps(self.stats))

    # -- duplicate check (enable_duplicate_check / duplicate_check_interval) -------------------
    def is_duplicate(self, userid: str, body: dict, interval: float) -> bool:
        """True if the same message reached this user within ``interval``; else remember it."""
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=False).encode()).hexdigest()
        key, now = (userid, digest), self.clock()
        with self.lock:
            seen = self._duplicates.get(key)
            if seen is not None and now < seen:
                return True
            self._duplicates.pop(key, None)
            self._duplicates[key] = now + interval
            if len(self._duplicates) > self.config.max_items:
                for k in [k for k, until in self._duplicates.items() if until <= now]:
                    del self._duplicates[k]
                while len(self._duplicates) > self.config.max_items:
                    self._duplicates.popitem(last=False)
            return False

    # -- recorded traffic ---------------------------------------------------------------------
    def store_message(self, record: dict) -> dict:
        """A message the bot sent, with ``shown``: what WeCom shows of it (emulator.rendering)."""
        record = dict(record, shown=rendering.shown(record))
        with self.lock:
            record = dict(record, seq=self.next_seq(), direction="out")
            self.messages.append(record)
            return record

    # -- template cards ------------------------------------------------------------------------
    def issue_response_code(self, seq: int) -> str:
        """A code that may update the card message ``seq`` once (message/send and every click
        hand one out, as WeCom does)."""
        code = secrets.token_urlsafe(24)
        with self.lock:
            self.response_codes[code] = {"seq": seq, "used": False}
            while len(self.response_codes) > self.config.max_items:
                self.response_codes.popitem(last=False)
        return code

    def use_response_code(self, code: str) -> dict | None:
        """The card message the code updates (the code is spent), or None: unknown or used."""
        with self.lock:
            entry = self.response_codes.get(code or "")
            if entry is None or entry["used"]:
                return None
            entry["used"] = True
            return next((m for m in self.messages if m["seq"] == entry["seq"]), None)

    def find_card(self, userid: str, task_id: str) -> dict | None:
        """The template card message ``task_id`` sent to ``userid`` (the newest)."""
        with self.lock:
            for m in reversed(self.messages):
                if (m.get("msgtype") == "template_card" and m.get("touser") == userid
                        and (m.get("payload") or {}).get("task_id") == task_id):
                    return m
        return None

    def store_inbound(self, record: dict) -> dict:
        with self.lock:
            record = dict(record, seq=self.next_seq(), direction="in")
            self.inbound.append(record)
            return record

    def store_attempt(self, record: dict) -> None:
        with self.lock:
            self.callbacks.append(dict(record, seq=self.next_seq()))
            delivery = self.deliveries.get(record["delivery_id"])
            if delivery is not None:
                delivery["attempts"] += 1
                delivery["last_status_code"] = record.get("status_code")

    def open_delivery(self, delivery_id: int, info: dict) -> None:
        with self.lock:
            self.deliveries[delivery_id] = dict(info, status="pending", attempts=0)
            while len(self.deliveries) > self.config.max_items:
                self.deliveries.popitem(last=False)

    def close_delivery(self, delivery_id: int, status: str) -> None:
        with self.lock:
            if delivery_id in self.deliveries:
                self.deliveries[delivery_id]["status"] = status

    def select(self, items: deque, since: int = 0, limit: int | None = None, **match) -> list[dict]:
        with self.lock:
            found = [dict(i) for i in items if i["seq"] > since
                     and all(v in (None, "") or i.get(k) == v for k, v in match.items())]
        return found[:limit] if limit else found
