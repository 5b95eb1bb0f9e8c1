"""A group chat's answer draws only on what every member may see, through the real processor:
the emulator's AI bot (group chats, appchat/get, the address book and its change events) ->
gunicorn -> outbox -> Celery -> the stand-in model, whose prompts the test reads.

The knowledge base holds the public handbook and a finance-only document with a sentinel. The
finance manager (xuli, department 7) asks the same question everywhere; the question matches both
documents, so the model is always called and its prompt shows what was in scope.
"""

import os
import subprocess
import sys
import time
import uuid

import pytest

from scripts.dev_env import random_aes_key
from tests.support.stack import ROOT, Stack, select_rows, wait_for

pytestmark = pytest.mark.integration
SENTINEL = "SENTINEL-GROUP-9c41"
HANDBOOK = """# 员工手册 Handbook

## 年假 Annual leave

年假：入职第一年 10 天，每满一年加 1 天。Annual leave: 10 days in the first year.
"""
FINANCE_ONLY = f"""# 财务内部 Finance only

## 奖金池 Bonus pool

奖金池口令是 {SENTINEL}，仅财务部可见。The bonus pool code is {SENTINEL}.
"""
FINANCE = 7
QUESTION = "奖金池口令是什么，年假有几天？bonus pool code and annual leave"


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"group-scope-{request.param}")
    s = Stack(tmp, db_kind=request.param, redis_db=6,
              extra_env={"AIBOT_TOKEN": "aibot-token-for-tests", "AIBOT_ENCODING_AES_KEY": random_aes_key(),
                         "AIBOT_NAME": "小星", "AIBOT_REFRESH_THROTTLE_S": "0",
                         # long enough that only WeCom's change event can move a member in time
                         "DEPARTMENT_CACHE_S": "600", "CHAT_MEMBERS_CACHE_S": "2",
                         # the handbook passage alone is relevant enough to be answered from
                         "KB_MIN_SCORE": "0.01"},
              emulator_options={"aibot_poll_interval": 0.1}).start()
    try:
        for name, text, departments in (("handbook.md", HANDBOOK, None),
                                        ("finance.md", FINANCE_ONLY, FINANCE)):
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            argv = [sys.executable, "-m", "app.cli", "kb", "add", str(path), "--title",
                    "员工手册" if departments is None else "财务制度"]
            if departments is not None:
                argv += ["--departments", str(departments)]
            subprocess.run(argv, cwd=ROOT, env={**os.environ, **s.env}, check=True, capture_output=True, timeout=120)
        yield s
    finally:
        s.stop()


def group(stack, *members, by_app=True) -> str:
    chat_id = uuid.uuid4().hex[:20]
    stack.emu("POST", "chats", json={"chatid": chat_id, "userlist": list(members), "by_app": by_app})
    return chat_id


def ask(stack, user: str = "xuli", chat_id: str | None = None) -> tuple[str, list[dict]]:
    """(the answer WeCom shows, the prompt the model was given) for QUESTION, tagged to find it."""
    tag = uuid.uuid4().hex[:8]
    body = {"from_user": user, "content": f"{QUESTION} {tag}"}
    if chat_id:
        body.update(chat_type="group", chat_id=chat_id)
    sent = stack.emu("POST", "aibot/send", json=body)
    done = wait_for(lambda: (c := stack.emu("GET", "aibot/conversations",
                                            params={"delivery_id": sent["delivery_id"]})["conversations"][0])
                    ["status"] not in ("pending", "streaming") and c, 60, 0.2, "the answer")
    assert done["status"] == "finished", done
    prompts = [p for p in list(stack.model.prompts) if tag in (p[-1].get("content") or "")]
    assert len(prompts) == 1, "the model was asked once for this question"
    return done["final"], prompts[0]


def shown(prompt: list[dict]) -> str:
    return "\n".join(m.get("content") or "" for m in prompt)


def assert_company_wide(answer: str, prompt: list[dict]) -> None:
    assert "员工手册" in shown(prompt) and "员工手册" in answer  # the public passage is used
    assert SENTINEL not in shown(prompt) and SENTINEL not in answer
    assert "财务制度" not in answer and "奖金池 Bonus pool" not in answer  # never cited


def assert_finance(answer: str, prompt: list[dict]) -> None:
    assert SENTINEL in shown(prompt)
    assert "财务制度 › 奖金池 Bonus pool" in answer


def test_a_one_to_one_chat_gets_the_askers_documents(stack):
    assert_finance(*ask(stack))


def test_a_group_with_a_member_outside_finance_gets_no_finance_passage(stack):
    """The leak: xuli asks in a group with zhangwei (R&D): the finance passage is neither in the
    prompt nor cited in what the group sees."""
    assert_company_wide(*ask(stack, chat_id=group(stack, "xuli", "zhangwei")))


def test_a_group_of_finance_members_gets_the_finance_passage(stack):
    assert_finance(*ask(stack, chat_id=group(stack, "xuli", "sunhao")))


def test_a_group_whose_members_cannot_be_read_gets_company_wide_documents_only(stack):
    """A group the bot was merely added to (appchat/get: 86008), a chat WeCom does not know
    (86003), and appchat/get failing: only the documents visible to everyone."""
    assert_company_wide(*ask(stack, chat_id=group(stack, "xuli", "sunhao", by_app=False)))
    assert_company_wide(*ask(stack, chat_id="neverseen" + uuid.uuid4().hex[:8]))
    finance_only = group(stack, "xuli", "sunhao")
    stack.emu("POST", "faults", json={"api": "appchat/get", "http_status": 502})
    assert_company_wide(*ask(stack, chat_id=finance_only))
    assert_finance(*ask(stack, chat_id=finance_only))  # the failure was not cached


def test_a_member_who_joins_counts_within_the_member_cache(stack):
    chat_id = group(stack, "xuli", "sunhao")
    assert_finance(*ask(stack, chat_id=chat_id))
    stack.emu("POST", f"chats/{chat_id}/members", json={"add": ["lina"]})
    time.sleep(2.5)  # CHAT_MEMBERS_CACHE_S
    assert_company_wide(*ask(stack, chat_id=chat_id))


def contact_events(stack) -> list[dict]:
    return select_rows(stack.db.url, "SELECT id, status FROM inbound_messages WHERE event = 'change_contact'")


def move(stack, user: str, departments: list[int]) -> None:
    """An admin moves ``user``; WeCom's change_contact event reaches the app and is handled."""
    before = len(contact_events(stack))
    stack.emu("POST", "contact", json={"userid": user, "department": departments, "wait": True})
    wait_for(lambda: len(rows := contact_events(stack)) == before + 1 and rows[-1]["status"] != "queued"
             and rows[-1]["status"] != "processing", 30, 0.2, "the change_contact event to be handled")


def test_a_change_contact_event_moves_a_member_within_the_department_cache(stack):
    """huangmin (marketing) is cached for DEPARTMENT_CACHE_S (600 s here) after the first
    question; moved into finance and out again, each change reaches the group's next answer
    through WeCom's change_contact event alone."""
    chat_id = group(stack, "xuli", "huangmin")
    assert_company_wide(*ask(stack, chat_id=chat_id))
    move(stack, "huangmin", [5, FINANCE])
    assert_finance(*ask(stack, chat_id=chat_id))
    move(stack, "huangmin", [5])
    assert_company_wide(*ask(stack, chat_id=chat_id))
