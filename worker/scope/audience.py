"""Who reads the answer to a message: the asker alone, or everyone in a group chat.

The knowledge base gives an answer only what all its readers may see (``app.knowledge.audience``).
A 1:1 chat (the self-built app's messages, the AI bot's ``chattype: single``) is read by the asker.
The AI bot's ``chattype: group`` messages (``chatid`` beside them, ``app.wecom.aibot``) are read
by the whole group, so each member's departments count:

- the members come from WeCom's appchat/get, which answers for the group chats this app created
  (appchat/create) and refuses any other (86003, 86008). The list is cached in Redis for
  ``CHAT_MEMBERS_CACHE_S`` (sealed: it is a list of user ids), and so is WeCom's refusal; an
  unreachable WeCom is not cached (asked again with the next message);
- each member's departments come from ``worker.scope.directory`` (``user/get``, cached briefly and
  forgotten on WeCom's change events);
- a chat whose members cannot be read, one of more than ``GROUP_SCOPE_MAX_MEMBERS`` members, or
  one with a member whose departments are unknown gets only the documents visible to everyone.

The asker counts as a member even when a cached list predates them.
"""

from __future__ import annotations

import json
import logging

from app.knowledge.audience import Audience
from app.outbox import rows
from app.security.fieldcrypt import FieldDecryptError
from app.wecom.exceptions import WeComAPIError, WeComTransientError
from worker.scope.directory import Directory

log = logging.getLogger(__name__)
UNREADABLE = "unreadable"  # the cached verdict for a chat WeCom would not list


def chat_of(payload: dict) -> str | None:
    """The group chat id of a message's payload, or None for a 1:1 message."""
    if payload.get("chat_type") == "group" and isinstance(payload.get("chat_id"), str):
        return payload["chat_id"] or None
    return None


class Audiences:
    def __init__(self, services, wecom, directory: Directory):
        self.services = services
        self.settings = services.settings
        self.wecom = wecom
        self.directory = directory

    def of(self, user_hash: str, user_id: str, chat_id: str | None) -> Audience:
        """The readers of an answer to ``user_id`` in ``chat_id`` (None: a 1:1 chat)."""
        if chat_id is None:
            return Audience.member(self.directory.member(user_hash, user_id).departments if user_id else ())
        return self.of_group(chat_id, user_id)

    def of_group(self, chat_id: str, asker: str) -> Audience:
        members = self.members(chat_id)
        if members is None:
            log.info("group audience: members not readable, company-wide documents only")
            return Audience.company_wide()
        if asker and asker.lower() not in members:
            members = [asker.lower(), *members]
        if len(members) > self.settings.group_scope_max_members:
            log.info("group audience: %d members, over GROUP_SCOPE_MAX_MEMBERS; company-wide only",
                     len(members))
            return Audience.company_wide()
        readers = []
        for member in members:
            departments = self.directory.member(rows.user_hash(self.services.blind_index, member),
                                                member).departments
            if not departments:  # unknown, or in no department: nothing scoped for anyone
                return Audience.company_wide()
            readers.append(departments)
        audience = Audience.of(readers)
        log.info("group audience: %d members, %d department conditions", len(members),
                 len(audience.requirements()))
        return audience

    # -- the member list ---------------------------------------------------------------------------
    def _key(self, chat_id: str) -> str:
        return f"chat-members:{self.services.blind_index('wecom-chat', chat_id)}"

    def members(self, chat_id: str) -> list[str] | None:
        """The chat's members (lower-case user ids), or None when WeCom will not list them."""
        key = self._key(chat_id)
        cached = self._cached(key)
        if cached is not None:
            return None if cached == UNREADABLE else cached
        try:
            info = self.wecom.get_app_chat(chat_id)
        except WeComTransientError:
            log.warning("appchat/get unreachable; this answer uses company-wide documents only")
            return None
        except WeComAPIError as exc:  # not a chat this app created: WeCom will not list it
            log.info("appchat/get refused errcode=%s", exc.errcode)
            self._store(key, UNREADABLE)
            return None
        except Exception:  # noqa: BLE001 - anything else: the safe answer, asked again next time
            log.warning("appchat/get failed; company-wide documents only")
            return None
        members = sorted({str(u).strip().lower() for u in info["userlist"] if str(u).strip()})
        self._store(key, members)
        return members

    def _cached(self, key: str):
        try:
            raw = self.services.redis.get(key)
            if raw is None:
                return None
            return json.loads(self.services.cipher.decrypt(raw.decode(), "redis", "chat-members", key))
        except (FieldDecryptError, ValueError):  # a key rotated away: read it again
            return None
        except Exception:  # noqa: BLE001 - without Redis, WeCom is asked
            log.debug("chat member cache unavailable")
            return None

    def _store(self, key: str, value) -> None:
        ttl = self.settings.chat_members_cache_s
        if ttl <= 0:
            return
        try:
            sealed = self.services.cipher.encrypt(json.dumps(value), "redis", "chat-members", key)
            self.services.redis.set(key, sealed, ex=ttl)
        except Exception:  # noqa: BLE001 - uncached: asked again next time
            log.debug("chat member cache not written")
