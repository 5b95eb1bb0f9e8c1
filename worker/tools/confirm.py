"""Ask before acting: a side-effecting call waits for the asker's 确认.

The proposed call (server, tool, arguments, what it will do) is kept sealed in Redis for
``TOOLS_CONFIRM_TTL_S`` under a random id; the app channel gets a card with 确认 / 取消 (a
``template_card_event`` answers it), and on every channel the asker may reply 确认 or 取消 to
their latest one. Only the asker decides (the clicker's blind index must be the proposer's), and
once: the decision is a Redis ``SET NX``, so a double click or a redelivered event runs nothing
twice.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from dataclasses import dataclass

log = logging.getLogger(__name__)
TABLE, COLUMN = "tool_confirmations", "pending"
CONFIRM_KEY, CANCEL_KEY = "tool_confirm", "tool_cancel"
TASK_PREFIX = "tool-"
_TASK = re.compile(r"^tool-([0-9a-f]{24})$")
YES = ("确认", "确定", "confirm", "yes")
NO = ("取消", "cancel", "no")


@dataclass(frozen=True)
class Pending:
    id: str
    user_hash: str
    server: str
    tool: str
    arguments: dict
    summary: str
    message_id: int


class Confirmations:
    def __init__(self, services):
        self.services = services
        self.ttl_s = services.settings.tools_confirm_ttl_s

    def _key(self, cid: str) -> str:
        return f"tools:confirm:{cid}"

    def propose(self, user_hash: str, server: str, tool: str, arguments: dict, summary: str,
                message_id: int) -> Pending:
        cid = secrets.token_hex(12)
        body = json.dumps({"user_hash": user_hash, "server": server, "tool": tool,
                           "arguments": arguments, "summary": summary, "message_id": message_id},
                          ensure_ascii=False)
        sealed = self.services.cipher.encrypt(body, TABLE, COLUMN, cid)
        redis = self.services.redis
        redis.set(self._key(cid), sealed, ex=self.ttl_s)
        redis.set(f"tools:confirm:last:{user_hash}", cid, ex=self.ttl_s)
        return Pending(cid, user_hash, server, tool, arguments, summary, message_id)

    def load(self, cid: str) -> Pending | None:
        sealed = self.services.redis.get(self._key(cid))
        if sealed is None:
            return None
        data = json.loads(self.services.cipher.decrypt(sealed.decode(), TABLE, COLUMN, cid))
        return Pending(cid, data["user_hash"], data["server"], data["tool"], data["arguments"],
                       data["summary"], int(data["message_id"]))

    def latest_of(self, user_hash: str) -> str | None:
        cid = self.services.redis.get(f"tools:confirm:last:{user_hash}")
        return cid.decode() if cid else None

    def decide_once(self, pending: Pending) -> bool:
        """True for the first decision on ``pending`` only (Redis SET NX); the pending call goes,
        and a later typed 确认 no longer finds it as the asker's latest."""
        redis = self.services.redis
        first = bool(redis.set(f"tools:confirm:done:{pending.id}", "1", nx=True, ex=self.ttl_s * 2))
        if first:
            redis.delete(self._key(pending.id))
            latest = f"tools:confirm:last:{pending.user_hash}"
            if (redis.get(latest) or b"").decode() == pending.id:
                redis.delete(latest)
        return first


def card(pending: Pending) -> dict:
    """The app channel's button_interaction card for one proposed call."""
    return {
        "card_type": "button_interaction",
        "main_title": {"title": "请确认操作", "desc": pending.summary[:120]},
        "sub_title_text": "只有你本人可以确认；超时后自动作废。",
        "task_id": f"{TASK_PREFIX}{pending.id}",
        "button_list": [
            {"text": "确认", "style": 1, "key": CONFIRM_KEY},
            {"text": "取消", "style": 2, "key": CANCEL_KEY},
        ],
    }


def click_of(payload: dict) -> tuple[str, bool] | None:
    """A ``template_card_event`` as (confirmation id, confirmed?), None if not a tool card's."""
    match = _TASK.fullmatch(str(payload.get("task_id") or ""))
    key = str(payload.get("event_key") or "")
    if match is None or key not in (CONFIRM_KEY, CANCEL_KEY):
        return None
    return match.group(1), key == CONFIRM_KEY


def answer_of(text: str) -> bool | None:
    """A typed 确认 (True) or 取消 (False); None for anything else."""
    word = text.strip().strip("。.!！ ").lower()
    if word in YES:
        return True
    if word in NO:
        return False
    return None
