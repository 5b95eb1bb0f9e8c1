"""A customer's answer draws only on documents visible to everyone, a question the documents do
not answer is handed to a person, and the channel's calls are charged to the ``kf`` ledger
department (the emulator's customer -> gunicorn -> Celery -> the stand-in model, whose prompts
the test reads)."""

import os
import subprocess
import sys
import uuid

import pytest

from app.kf.rules import DECLINE_HANDOVER
from tests.support.stack import ROOT, Stack, select_rows, wait_for

pytestmark = pytest.mark.integration
SENTINEL = "SENTINEL-KF-5d20"
HANDBOOK = """# 客户指南 Customer guide

## 营业时间 Opening hours

门店营业时间：每天 9:00 到 21:00。Our shops open 9:00 to 21:00 every day.
"""
FINANCE_ONLY = f"""# 财务内部 Finance only

## 营业时间内部口令 Opening hours code

营业时间内部口令是 {SENTINEL}，仅财务部可见。The opening hours code is {SENTINEL}.
"""
QUESTION = "营业时间是几点？口令是什么 opening hours code"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kf-knowledge")
    s = Stack(tmp, db_kind="postgres", redis_db=12,
              extra_env={"KF_ENABLED": "true", "KF_SERVICER_USERID": "zhangsan",
                         "KB_MIN_SCORE": "0.01"}).start()
    try:
        for name, text, departments in (("guide.md", HANDBOOK, None), ("finance.md", FINANCE_ONLY, 7)):
            path = tmp / name
            path.write_text(text, encoding="utf-8")
            argv = [sys.executable, "-m", "app.cli", "kb", "add", str(path), "--title",
                    "客户指南" if departments is None else "财务制度"]
            if departments is not None:
                argv += ["--departments", str(departments)]
            subprocess.run(argv, cwd=ROOT, env={**os.environ, **s.env}, check=True, capture_output=True,
                           timeout=120)
        yield s
    finally:
        s.stop()


def ask(stack, customer: str, text: str) -> list[str]:
    stack.emu("POST", "kf/send", json={"external_userid": customer, "content": text})
    return wait_for(lambda: [m["content"] for m in stack.emu("GET", "kf/messages", params={
        "external_userid": customer})["messages"]], 60, 0.2, "the answer")


def test_a_customer_sees_only_documents_for_everyone(stack):
    tag = uuid.uuid4().hex[:8]
    # A customer whose id happens to be a finance member's userid (xuli, department 7): a path
    # that asked the directory about the customer would show them the finance passage.
    answer = ask(stack, "xuli", f"{QUESTION} {tag}")
    prompts = [p for p in list(stack.model.prompts) if tag in (p[-1].get("content") or "")]
    assert len(prompts) == 1
    shown = "\n".join(m.get("content") or "" for m in prompts[0])
    assert "客户指南" in shown and SENTINEL not in shown
    assert SENTINEL not in "".join(answer) and "财务制度" not in "".join(answer)
    departments = {r["department"] for r in select_rows(stack.db.url, "SELECT department FROM usage_records")}
    assert departments == {"kf"}  # a customer is in no department: the channel's own ledger line


def test_a_question_the_documents_do_not_answer_goes_to_a_person(stack):
    customer = "wmKbCustomer02"
    answer = ask(stack, customer, "火星上的天气怎么样 weather on mars")
    assert answer[0].endswith(DECLINE_HANDOVER)
    sessions = stack.emu("GET", "kf/sessions")["sessions"]
    assert next(s for s in sessions if s["external_userid"] == customer)["state"] == 3
