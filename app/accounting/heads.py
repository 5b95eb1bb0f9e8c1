"""A department budget's alerts to the department's heads, where managers are: an app message
(``message/send`` to their userids) and, where the AI bot's long connection is set up, the bot
writing to each of them first (``aibot_send_msg``, through ``app.aibot.pushes``).

The heads come from the directory: WeCom's ``department/get`` answers ``department_leader``
(the heads' userids within the app's visible range). A department without a head of its own
goes to the nearest department above it that has one, never to the root (the whole company's
heads would get every team's alerts). ``user/get``'s ``is_leader_in_dept`` says the same per
member, but finding the heads from it would mean listing every member.

The app message asks WeCom's duplicate check for 4 hours: an alert sent again after a worker
died between sending and recording it (``app.accounting.redelivery``) reaches nobody twice.
"""

from __future__ import annotations

import logging

from app.accounting.alerts import PERIOD_NAMES, RaisedAlert
from app.wecom.exceptions import InvalidUserError, WeComAPIError

log = logging.getLogger(__name__)
MAX_LEVELS = 15  # WeCom nests departments 15 deep at most
DUPLICATE_CHECK_S = 14400  # WeCom's longest window


def department_heads(wecom, department: str) -> tuple[list[str], str]:
    """The heads of ``department`` (an id), or of the nearest department above it with heads,
    and that department's name; ([], "") when none below the root has one."""
    try:
        dept_id = int(department)
    except (TypeError, ValueError):
        return [], ""
    seen: set[int] = set()
    while dept_id > 0 and dept_id not in seen and len(seen) < MAX_LEVELS:
        seen.add(dept_id)
        info = wecom.get_department(dept_id)
        parent = int(info.get("parentid") or 0)
        if parent == 0 and len(seen) > 1:
            break  # the root: not for a team's alert
        leaders = [u for u in info.get("department_leader") or [] if isinstance(u, str) and u.strip()]
        if leaders:
            return leaders, str(info.get("name") or dept_id)
        dept_id = parent
    return [], ""


def head_alert_text(alert: RaisedAlert, department_name: str) -> str:
    """The alert as a department head reads it (plain text: the app channel's)."""
    period = PERIOD_NAMES.get(alert.period, alert.period)
    if alert.threshold >= 100:
        state = ("已用完，部门成员的新提问将被拦截 used up: new questions from the department are blocked"
                 if alert.action == "block" else "已用完 used up")
    else:
        state = f"已用 {alert.threshold}% reached {alert.threshold}%"
    return (f"AI 助手部门预算提醒 Department budget alert\n"
            f"部门 Department: {department_name}\n"
            f"{period}: {state}\n"
            f"{alert.spent:.2f} / {alert.limit:.2f} {alert.currency}")


def head_alert_markdown(alert: RaisedAlert, department_name: str) -> str:
    """The same for the AI bot's chat (markdown)."""
    lines = head_alert_text(alert, department_name).split("\n")
    color = "warning" if alert.threshold >= 100 else "comment"
    return "\n".join([f"**{lines[0]}**", *(f'> <font color="{color}">{line}</font>' if i == 2 else f"> {line}"
                                           for i, line in enumerate(lines[1:], start=1))])


class DepartmentHeads:
    """An ``AlertSender`` route: department alerts to the heads. Returns the channels that took it
    (``heads``: the app message; ``aibot``: queued for the long connection)."""

    def __init__(self, wecom, pushes=None):
        self.wecom = wecom
        self.pushes = pushes  # app.aibot.pushes.Pushes when the long connection is set up

    def __call__(self, alert: RaisedAlert) -> list[str]:
        if alert.scope != "department":
            return []
        try:
            heads, name = department_heads(self.wecom, alert.scope_value)
        except Exception as exc:  # noqa: BLE001 - the admins and the dashboard still have it
            log.warning("budget alert %s: the department's heads unknown (%s)", alert.alert_id,
                        type(exc).__name__)
            return []
        if not heads:
            log.info("budget alert %s: the department has no head in the directory", alert.alert_id)
            return []
        channels = []
        try:
            self.wecom.send("|".join(heads), "text", head_alert_text(alert, name),
                            duplicate_check_interval=DUPLICATE_CHECK_S)
            channels.append("heads")
        except InvalidUserError as exc:  # some heads out of the app's range: the others have it
            if len(set(getattr(exc, "users", ()) or ())) < len(heads):
                channels.append("heads")
            log.warning("budget alert %s: some department heads could not be reached", alert.alert_id)
        except (WeComAPIError, Exception) as exc:  # noqa: BLE001
            log.warning("budget alert %s not sent to the department heads (%s)", alert.alert_id,
                        type(exc).__name__)
        if self.pushes is not None:
            queued = False
            for userid in heads:
                try:
                    queued |= self.pushes.add(f"alert:{alert.alert_id}:{userid.lower()}", userid,
                                              head_alert_markdown(alert, name))
                except Exception as exc:  # noqa: BLE001 - Redis away: the app message went
                    log.warning("budget alert %s not queued for the AI bot (%s)", alert.alert_id,
                                type(exc).__name__)
                    break
            if queued:
                channels.append("aibot")
        return channels
