"""Which departments an employee is in: WeCom ``user/get``, looked up once for everything that
needs it.

A department budget charges the employee's main department (``main_department``, else the first
of ``department``); the knowledge base searches the documents of all their departments. One
lookup serves both: cached in Redis for ``DEPARTMENT_CACHE_S`` (one key per user, shared by every
worker; 5 minutes by default), and in front of that in the process for up to ``LOCAL_S``, so a
worker does not ask Redis again for an employee it served a moment ago.

A change in WeCom reaches the bot when the Redis entry expires, or at once when WeCom tells us:
its ``change_contact`` event (update_user, delete_user) makes ``forget`` drop the member's Redis
entry and this process's own; another worker process may still answer from its own entry for
up to ``LOCAL_S``. So a member moved out of finance stops seeing finance documents within
``LOCAL_S`` of the event, and within ``DEPARTMENT_CACHE_S`` + ``LOCAL_S`` without one.

When ``user/get`` fails the employee is a member of no department for the knowledge base (only
documents visible to everyone are searched: a stale membership could show a department's
passages to someone who left it), and nothing is cached: the next message asks again. Budgets do
not fail open: ``budget_department`` charges the department last seen for the employee (kept for
``LAST_KNOWN_S``, refreshed by every successful lookup), so an outage of WeCom's directory does
not lift a department's limit; only an employee never seen before goes uncharged to a department
(global and personal budgets still apply; logged). Without
Redis, WeCom is asked (the process's own entry still applies).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from app.wecom.departments import DepartmentIdError, department_id, known_ids

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Member:
    main_department: str = ""  # "" when unknown
    departments: tuple[int, ...] = ()


UNKNOWN = Member()


class Directory:
    LOCAL_S = 30.0
    LAST_KNOWN_S = 90 * 86400  # the department a budget charges while user/get fails
    LOCAL_MAX = 10_000  # employees remembered in the process (the least recent go first)

    def __init__(self, services, wecom):
        self.services = services
        self.wecom = wecom
        self._local: OrderedDict[str, tuple[float, Member]] = OrderedDict()
        self._lock = threading.Lock()

    def member(self, user_hash: str, user_id: str) -> Member:
        now = time.monotonic()
        with self._lock:
            held = self._local.get(user_hash)
            if held is not None and held[0] > now:
                self._local.move_to_end(user_hash)
                return held[1]
        member = self._shared(user_hash, user_id)
        if member is not UNKNOWN:
            with self._lock:
                self._local[user_hash] = (now + min(self.LOCAL_S, self.services.settings.department_cache_s),
                                          member)
                self._local.move_to_end(user_hash)
                while len(self._local) > self.LOCAL_MAX:
                    self._local.popitem(last=False)
        return member

    def forget(self, user_hash: str) -> None:
        """Drop what is cached of one member (WeCom said they changed): asked again next time."""
        with self._lock:
            self._local.pop(user_hash, None)
        try:
            self.services.redis.delete(self.key(user_hash))
        except Exception:  # noqa: BLE001 - the entry then expires on its own (DEPARTMENT_CACHE_S)
            log.warning("department cache entry not dropped (Redis)")

    def budget_department(self, user_hash: str, user_id: str) -> str:
        """The department a department budget charges: the current one, else (``user/get``
        failing) the last one seen for this employee, else "" (none known)."""
        department = self.member(user_hash, user_id).main_department
        if department:
            return department
        try:
            last = self.services.redis.get(self.last_key(user_hash))
        except Exception:  # noqa: BLE001 - without Redis nothing is known to charge
            last = None
        if last:
            log.warning("user/get failed; the department last seen is charged")
            return last.decode() if isinstance(last, bytes) else str(last)
        log.warning("user/get failed for an employee never seen; no department budget applies")
        return ""

    @staticmethod
    def key(user_hash: str) -> str:
        return f"member:{user_hash}"

    @staticmethod
    def last_key(user_hash: str) -> str:
        return f"member:last:{user_hash}"

    def _shared(self, user_hash: str, user_id: str) -> Member:
        key = self.key(user_hash)
        try:
            cached = self.services.redis.get(key)
            if cached is not None:
                main, departments = json.loads(cached)
                return Member(main, tuple(departments))
        except Exception:  # noqa: BLE001 - without Redis (or an unreadable entry), ask WeCom
            log.debug("department cache unavailable")
        try:
            found = self.wecom.get_user(user_id)
            member = _member_of(found)
        except Exception:  # noqa: BLE001 - unknown: no department budget, public documents only
            log.warning("user/get failed; departments unknown for this message")
            return UNKNOWN
        with contextlib.suppress(Exception):  # uncached: asked again next time
            self.services.redis.set(key, json.dumps([member.main_department, list(member.departments)]),
                                    ex=self.services.settings.department_cache_s)
            if member.main_department:
                self.services.redis.set(self.last_key(user_hash), member.main_department,
                                        ex=self.LAST_KNOWN_S)
        return member


def _member_of(found: dict) -> Member:
    """``user/get``'s answer as a ``Member``; ids that are not department ids are dropped."""
    listed = found.get("department")
    listed = listed if isinstance(listed, list) else []
    departments = known_ids(listed)
    main = ""
    for candidate in (found.get("main_department"), *listed):  # else the first listed
        try:
            main = str(department_id(candidate))
            break
        except DepartmentIdError:
            continue
    return Member(main, departments)
