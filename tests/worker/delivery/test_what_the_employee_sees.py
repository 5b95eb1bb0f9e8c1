"""What the employee sees, read from the emulator (its ``shown``: WeCom's rendering of each sent
message, emulator/rendering.py) with the whole stack running (gunicorn, Celery, the stand-in model
server): an answer with Markdown arrives as a ``markdown`` message and shows no mark; a plain one as
``text``; a long one in markdown chunks that each keep their bold and links whole; the AI bot's
stream renders its Markdown sources; a file sent through the emulator is what "这个文件讲了什么？"
is answered from, with the handbook loaded (never the knowledge base's decline); and the chat page
in a real browser draws the markdown as WeCom does (bold, links, no literal ``**``).

One stack on SQLite: what is checked is the message path's formatting, not the database.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.dev_env import random_aes_key
from tests.support.browser import CHROMIUM
from tests.support.stack import ROOT, Stack, select_rows, wait_for
from worker.knowledge import PRESENCE_TTL_S

pytestmark = pytest.mark.integration
HANDBOOK = """# 员工手册 Handbook

## 住宿 Hotels

出差住宿：北京、上海每晚最多 600 元，其他城市 400 元。Hotels: up to 600 RMB a night in Beijing and Shanghai.
"""
MARKDOWN_ANSWER = ("## 住宿标准\n\n- 北京：**600 RMB** 每晚\n- 其他城市：**400 RMB**\n\n"
                   "详见 [差旅制度](https://example.com/travel)，用 `kb search` 查。")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sees")
    s = Stack(tmp, db_kind="sqlite", redis_db=12, extra_env={
        "AIBOT_TOKEN": "aibot-token-for-tests", "AIBOT_ENCODING_AES_KEY": random_aes_key(),
        "AIBOT_NAME": "小星", "AIBOT_REFRESH_THROTTLE_S": "0", "MEDIA_MAX_BYTES": str(256 * 1024),
        "FEEDBACK_CARDS": "true"},
        emulator_options={"aibot_poll_interval": 0.1}).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def employees(stack):
    return iter([u["userid"] for u in stack.emu("GET", "directory")["users"]])


@pytest.fixture
def user(employees):
    return next(employees)


def sent(stack, user, start: int, count: int, timeout: float = 60) -> list[dict]:
    """The messages the bot sent ``user`` after the first ``start`` (cards left out)."""
    def ready():
        items = [m for m in stack.emu("GET", "messages", params={"touser": user})["messages"]
                 if m["msgtype"] != "template_card"]
        return items[start:] if len(items) - start >= count else None

    return wait_for(ready, timeout, 0.3, f"{count} messages")


def load_handbook(stack) -> None:
    path = Path(stack.tmp) / "handbook.md"
    path.write_text(HANDBOOK, encoding="utf-8")
    subprocess.run([sys.executable, "-m", "app.cli", "kb", "add", str(path), "--title", "员工手册"],
                   env={**stack.env, "PATH": "/usr/bin:/bin"}, cwd=ROOT, check=True, capture_output=True)
    time.sleep(PRESENCE_TTL_S + 0.5)  # the worker asks whether documents exist at most this often


def test_markdown_arrives_as_markdown_and_shows_no_mark(stack, user):
    stack.model.scripted["*"] = MARKDOWN_ANSWER
    try:
        stack.send(user, "出差住宿标准？", wait=True)
        [message] = sent(stack, user, 0, 1)
    finally:
        stack.model.scripted.clear()
    assert message["msgtype"] == "markdown", message
    assert "**600 RMB**" in message["content"] and "• 北京" in message["content"]
    shown = message["shown"]
    assert "**" not in shown and "](" not in shown and "`" not in shown and "\n- " not in shown
    assert "住宿标准" in shown and "600 RMB" in shown and "差旅制度" in shown


def test_a_plain_answer_is_text(stack, user):
    stack.send(user, "你好呀，今天怎么样", wait=True)
    [message] = sent(stack, user, 0, 1)
    assert message["msgtype"] == "text" and message["shown"] == message["content"]


def test_a_long_answer_is_split_without_breaking_a_span(stack, user):
    line = "- **第{n}条**：详见 [制度第{n}条](https://example.com/rules/{n})，说明文字" + "很长" * 30
    stack.model.scripted["*"] = "\n".join(line.format(n=n) for n in range(1, 41))
    try:
        stack.send(user, "把所有规定都列出来", wait=True)
        messages = sent(stack, user, 0, 2)
        wait_for(lambda: len(sent(stack, user, 0, 1)) >= 3, 30, 0.3, "all chunks")
        messages = sent(stack, user, 0, 1)
    finally:
        stack.model.scripted.clear()
    assert len(messages) >= 3 and all(m["msgtype"] == "markdown" for m in messages)
    for m in messages:
        assert len(m["content"].encode()) <= 4096
        assert m["content"].count("**") % 2 == 0 and m["content"].count("[") == m["content"].count("](")
        assert "**" not in m["shown"] and "](" not in m["shown"]
    assert "第40条" in messages[-1]["shown"]


def test_the_ai_bots_stream_and_a_file_question_with_the_handbook_loaded(stack, user):
    load_handbook(stack)
    stack.send(user, msg_type="file", wait=True)  # the emulator's policy.pdf
    read = sent(stack, user, 0, 1)[0]
    assert "policy.pdf" in read["shown"]
    stack.send(user, "这个文件讲了什么？", wait=True)
    answer = sent(stack, user, 1, 1)[0]
    assert "没有找到" not in answer["shown"] and "policy.pdf" in answer["shown"], answer
    system = [m["content"] for m in stack.model.last_body["messages"] if m["role"] == "system"]
    assert any("[1] policy.pdf" in c and "600 RMB per night" in c for c in system), system
    # the AI bot's stream: its sources in Markdown, shown rendered
    bot = stack.emu("POST", "aibot/send", json={"from_user": user, "content": "北京出差住宿每晚多少钱？",
                                                "wait": 60})
    final = wait_for(lambda: next((m for m in stack.emu("GET", "messages", params={"touser": user})["messages"]
                                   if m.get("delivery_id") == bot["delivery_id"] and m["msgtype"] == "stream"),
                                  None), 60, 0.3, "the stream's end")
    assert "**来源 / Sources**" in final["content"] and "> [1] 员工手册" in final["content"]
    assert "**" not in final["shown"] and "来源 / Sources" in final["shown"]


def test_a_thumbs_down_with_its_reason_is_tied_to_the_answers_sources(stack, user):
    """The card's drop-down reason comes back with the 👎 (WeCom's SelectedItems) and is stored
    with the rating; the answer's cited section was recorded when it was sent (needs the handbook
    the test above loaded)."""
    stack.send(user, "北京出差住宿每晚多少钱？", wait=True)
    answer = sent(stack, user, 0, 1)[0]
    assert "员工手册" in answer["shown"], answer
    card = wait_for(lambda: next((m for m in stack.emu("GET", "messages", params={"touser": user})["messages"]
                                  if m["msgtype"] == "template_card"), None), 30, 0.3, "the card")
    selection = card["payload"]["button_selection"]
    assert [o["id"] for o in selection["option_list"]] == ["0", "1", "2", "3"]
    stack.emu("POST", "card_click", json={"userid": user, "task_id": card["payload"]["task_id"],
                                          "key": "feedback_down", "selected": {selection["question_key"]: "2"}})
    rating = wait_for(lambda: select_rows(stack.db.url, "SELECT message_id, rating, reasons FROM answer_ratings"),
                      30, 0.3, "the rating")
    assert [(r["rating"], r["reasons"]) for r in rating] == [(-1, "2")]
    sources = select_rows(stack.db.url, "SELECT message_id, position, source_enc FROM answer_sources "
                                        f"WHERE message_id = {rating[0]['message_id']}")
    assert [s["position"] for s in sources] == [1] and "员工手册" not in sources[0]["source_enc"]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is missing (apt-get install -y chromium)")
def test_the_chat_page_draws_wecoms_markdown(stack, user):
    from playwright.sync_api import sync_playwright

    stack.model.scripted.update({"*": MARKDOWN_ANSWER, "住宿标准": MARKDOWN_ANSWER})  # the handbook is loaded
    try:
        stack.send(user, "出差住宿标准？", wait=True)
        [message] = sent(stack, user, 0, 1)
    finally:
        stack.model.scripted.clear()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(stack.emulator.url + "/")
            page.select_option("#user-select", user)
            bubble = page.locator(".msg.out .bubble .md").last
            bubble.wait_for(timeout=15_000)
            assert bubble.locator("b").first.inner_text() == "600 RMB"
            assert bubble.locator(".md-h2").inner_text() == "住宿标准"
            link = bubble.locator("a")
            assert link.inner_text() == "差旅制度" and link.get_attribute("href") == "https://example.com/travel"
            assert bubble.locator("code").inner_text() == "kb search"
            drawn = bubble.inner_text()
            assert "**" not in drawn and "](" not in drawn
            assert drawn.split() == message["shown"].split()  # the page shows what the API says
            # the 👍/👎 card under it, with its drop-down of reasons
            card = page.locator(".bubble.card").last
            card.wait_for(timeout=15_000)
            assert card.locator("select.card-select option").all_inner_texts()[1:] == ["与问题无关", "内容不完整",
                                                                                       "内容有错误"]
        finally:
            browser.close()
