"""The emulated group chats (群聊) and what WeCom tells an app about them.

WeCom lets an app read a group chat's members only for the chats the app created itself
(appchat/create; appchat/get then answers ``chat_info`` with ``userlist``): any other chat is
refused, 86003 for an unknown chatid and 86008 for a chat that is not this app's. The AI bot,
added to a group by its members, sees the chat's ``chatid`` in every callback and nothing more.

Here both kinds exist: a chat made through appchat/create (or ``POST /_emulator/chats`` with
``by_app`` true, the default) is readable; one made with ``by_app`` false is a group the bot was
merely added to. Chats are set-up, like the directory: ``reset()`` keeps them.
"""

from __future__ import annotations

import re
import secrets
import threading

from emulator.directory import Directory

# WeCom's limits (appchat/create): chatid at most 32 of 0-9a-zA-Z, 2 to 2000 members, a name of
# at most 50 characters.
CHATID = re.compile(r"[0-9A-Za-z]{1,32}")
MIN_MEMBERS, MAX_MEMBERS = 2, 2000
CHAT_NOT_FOUND, CHAT_NOT_OURS, BAD_CHATID, BAD_MEMBERS, BAD_USER = 86003, 86008, 86001, 86006, 86007


class ChatError(ValueError):
    """A request WeCom refuses; ``errcode`` is the code it answers."""

    def __init__(self, errcode: int, message: str):
        super().__init__(message)
        self.errcode = errcode


class GroupChats:
    def __init__(self, directory: Directory):
        self.directory = directory
        self._lock = threading.Lock()
        self._chats: dict[str, dict] = {}

    def create(self, userlist, *, chatid: str = "", name: str = "", owner: str = "",
               by_app: bool = True) -> dict:
        members = self._members(userlist)
        if len(members) < MIN_MEMBERS or len(members) > MAX_MEMBERS:
            raise ChatError(BAD_MEMBERS, f"a group chat has {MIN_MEMBERS} to {MAX_MEMBERS} members")
        chatid = chatid or secrets.token_hex(16)
        if not isinstance(chatid, str) or not CHATID.fullmatch(chatid):
            raise ChatError(BAD_CHATID, "chatid is at most 32 of 0-9 a-z A-Z")
        owner = (owner or "").lower() or members[0]
        if owner not in members:
            raise ChatError(BAD_USER, "the owner must be a member")
        chat = {"chatid": chatid, "name": str(name or "")[:50], "owner": owner, "userlist": members,
                "by_app": bool(by_app)}
        with self._lock:
            if chatid in self._chats:
                raise ChatError(BAD_CHATID, "chatid exists already")
            self._chats[chatid] = chat
        return dict(chat)

    def get(self, chatid: str) -> dict:
        """``chat_info`` as appchat/get answers it, or ``ChatError`` (86003, 86008)."""
        with self._lock:
            chat = self._chats.get(chatid or "")
        if chat is None:
            raise ChatError(CHAT_NOT_FOUND, "chatid not found")
        if not chat["by_app"]:
            raise ChatError(CHAT_NOT_OURS, "not allow to operate a chat the app did not create")
        return {k: (list(v) if k == "userlist" else v) for k, v in chat.items() if k != "by_app"}

    def update(self, chatid: str, *, add=(), remove=(), name: str | None = None,
               by_app_only: bool = True) -> dict:
        """appchat/update (``by_app_only``: only an app-created chat, as WeCom); the admin API
        may change any chat (members join a group the bot is in)."""
        added, removed = self._members(add or ()), self._members(remove or ())
        with self._lock:
            chat = self._chats.get(chatid or "")
            if chat is None:
                raise ChatError(CHAT_NOT_FOUND, "chatid not found")
            if by_app_only and not chat["by_app"]:
                raise ChatError(CHAT_NOT_OURS, "not allow to operate a chat the app did not create")
            members = [u for u in chat["userlist"] if u not in removed]
            members += [u for u in added if u not in members]
            if len(members) > MAX_MEMBERS:
                raise ChatError(BAD_MEMBERS, f"at most {MAX_MEMBERS} members")
            chat = dict(chat, userlist=members, name=chat["name"] if name is None else str(name)[:50])
            self._chats[chatid] = chat
        return dict(chat)

    def all(self) -> list[dict]:
        with self._lock:
            return [dict(c) for c in self._chats.values()]

    def is_member(self, chatid: str, userid: str) -> bool | None:
        """Whether ``userid`` is in the chat; None for a chat the emulator does not know."""
        with self._lock:
            chat = self._chats.get(chatid or "")
        return None if chat is None else userid.lower() in chat["userlist"]

    def _members(self, userlist) -> list[str]:
        if isinstance(userlist, str) or not isinstance(userlist, list | tuple):
            raise ChatError(BAD_USER, "userlist must be a list of userids")
        found: list[str] = []
        for userid in userlist:
            user = self.directory.user(str(userid)) if isinstance(userid, str) else None
            if user is None:
                raise ChatError(BAD_USER, "a member is not in the directory")
            if user["userid"] not in found:
                found.append(user["userid"])
        return found
