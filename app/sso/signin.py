"""The WeCom sign-in itself: the URL that sends the browser to WeCom, and what the code it
brings back is worth (a ``SignInResult``: an admin account with its role, or why not).

A member signs in to an ordinary ``admin_users`` row named ``wecom:<userid>``, made at the first
sign-in, so sessions, roles, disabling and the audit work as for password accounts. Its password
hash is ``UNUSABLE_HASH``, which no password verifies against: the password form never opens it.
Its role is set again from the mappings at every sign-in: roles follow the WeCom identity.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlencode

from sqlalchemy import delete, select

from app.db import utcnow
from app.models import AdminSession, AdminUser
from app.sso import roles
from app.sso.login_state import LoginStates, Pending, StateRefused
from app.wecom.exceptions import WeComAPIError, WeComTransientError

logger = logging.getLogger(__name__)

CHANNELS = ("qr", "oauth")  # the QR page in a desktop browser; OAuth inside the WeCom client
ACCOUNT_PREFIX = "wecom:"
UNUSABLE_HASH = "!wecom-sign-in"  # not an argon2 hash: verify() fails for every password
INVALID_CODE = 40029


@dataclass(frozen=True)
class SignInResult:
    outcome: str  # ok, or why not (the audit event's outcome)
    userid: str | None = None
    user: AdminUser | None = None
    next_path: str | None = None
    channel: str = ""
    role_source: str = ""


def account_name(userid: str) -> str:
    return ACCOUNT_PREFIX + userid.lower()


def is_wecom_account(name: str) -> bool:
    return name.startswith(ACCOUNT_PREFIX)


class WeComSignIn:
    def __init__(self, settings, wecom, db, redis):
        self.settings = settings
        self.wecom = wecom
        self.db = db
        self.states = LoginStates(redis, settings.wecom_login_state_ttl_s)

    def authorize_url(self, channel: str, state: str, redirect_uri: str) -> str:
        s = self.settings
        if channel == "oauth":
            query = urlencode({"appid": s.wecom_corp_id, "redirect_uri": redirect_uri,
                               "response_type": "code", "scope": "snsapi_base", "state": state,
                               "agentid": s.wecom_agent_id})
            return f"{s.wecom_oauth_base}/connect/oauth2/authorize?{query}#wechat_redirect"
        query = urlencode({"login_type": "CorpApp", "appid": s.wecom_corp_id,
                           "agentid": s.wecom_agent_id, "redirect_uri": redirect_uri, "state": state})
        return f"{s.wecom_login_base}/wwlogin/sso/login?{query}"

    def begin(self, channel: str, next_path: str | None) -> Pending:
        if channel not in CHANNELS:
            raise ValueError(f"channel must be one of {CHANNELS}")
        return self.states.begin(channel, next_path)

    def complete(self, pending: Pending | None, state: str, code: str) -> SignInResult:
        """Check the state, spend the code with WeCom, map the member to a role and an account."""
        try:
            record = self.states.finish(pending, state)
            self.states.claim_code(code)
        except StateRefused as refused:
            return SignInResult(refused.outcome)
        channel, next_path = record.get("channel", ""), record.get("next")
        try:
            userid = self.wecom.get_user_info(code).get("userid")
        except WeComTransientError:
            return SignInResult("wecom_down", channel=channel)
        except WeComAPIError as exc:
            return SignInResult("bad_code" if exc.errcode == INVALID_CODE else f"wecom_{exc.errcode}",
                                channel=channel)
        if not isinstance(userid, str) or not roles.USERID.match(userid):
            return SignInResult("not_member", channel=channel)  # an openid: not of this corp
        userid = userid.lower()
        if len(account_name(userid)) > 64:
            return SignInResult("userid_too_long", userid, channel=channel)
        decision = self._role(userid)
        if decision.role is None:
            return SignInResult(decision.outcome, userid, channel=channel)
        user, outcome = self._account(userid, decision.role)
        return SignInResult(outcome, userid, user, next_path, channel, decision.source)

    def _role(self, userid: str) -> roles.RoleDecision:
        with self.db.session() as session:
            own = roles.user_role(session, userid)
        if own is not None:
            return roles.RoleDecision(own, "ok", "user")
        try:
            departments = self.wecom.get_user(userid).get("department") or []
        except WeComTransientError:
            return roles.RoleDecision(None, "wecom_down")
        except WeComAPIError as exc:
            logger.info("user/get refused the signing-in member (errcode %s)", exc.errcode)
            return roles.RoleDecision(None, "no_role")
        with self.db.session() as session:
            return roles.department_role(session, [d for d in departments if str(d).isdigit()])

    def _account(self, userid: str, role: str) -> tuple[AdminUser, str]:
        """The member's admin account, made on first sign-in, with the mapped role."""
        with self.db.transaction() as session:
            user = session.scalar(select(AdminUser).where(AdminUser.name == account_name(userid)))
            if user is None:
                user = AdminUser(name=account_name(userid), role=role, password_hash=UNUSABLE_HASH,
                                 enabled=True, failed_attempts=0)
                session.add(user)
            elif not user.enabled:
                session.flush()
                session.expunge(user)
                return user, "disabled"  # an admin turned this account off: it stays off
            if user.role != role:
                end_sessions(session, user.id)  # the old role's sessions go with it
            user.role, user.last_login_at = role, utcnow()
            session.flush()
            session.expunge(user)
            return user, "ok"


def end_sessions(session, user_id: int | None = None) -> int:
    """End the sessions of one WeCom-linked account, or (``None``) of all of them: after their
    mapping changed, the role they were opened with may be wrong."""
    ids = select(AdminUser.id).where(AdminUser.name.startswith(ACCOUNT_PREFIX, autoescape=True))
    if user_id is not None:
        ids = ids.where(AdminUser.id == user_id)
    result = session.execute(delete(AdminSession).where(AdminSession.user_id.in_(ids))
                             .execution_options(synchronize_session=False))
    return result.rowcount or 0


def end_sessions_for_mapping(session, kind: str, value: str) -> int:
    """A changed or removed mapping: a userid's row ends that member's sessions; a department's,
    every WeCom-linked one (who is in the department is WeCom's to say). They sign in again and
    get the role the mappings give now."""
    if kind != "user":
        return end_sessions(session)
    user_id = session.scalar(select(AdminUser.id).where(AdminUser.name == account_name(value)))
    return 0 if user_id is None else end_sessions(session, user_id)
