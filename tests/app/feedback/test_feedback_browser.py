"""Feedback end to end in headless Chromium: an employee asks in the emulator's chat page, the
answer is followed by the 👍/👎 card, a click on 👍 goes back to the app as a signed
``template_card_event``, the card turns into "rated", and the admin dashboard shows the rating.
On the AI bot, WeCom's own 👍/👎 under a streamed answer (its first reply carried feedback.id)
sends the ``feedback_event``, and the dashboard counts it under the channel ``aibot``.

The whole stack runs (gunicorn, the Celery worker, beat, the emulator, a fake model server:
``tests/support/stack.py``); an admin account is made in its database.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from app.db import Database
from app.web.admin.accounts import create_user
from tests.support.browser import CHROMIUM
from tests.support.stack import Stack

pytestmark = pytest.mark.browser
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    running = Stack(tmp_path_factory.mktemp("feedback-stack"), redis_db=7, worker_concurrency=2,
                    extra_env={"SESSION_COOKIE_SECURE": "false", "WEB_WORKERS": "1",
                               "FEEDBACK_CARDS": "true"})
    try:
        running.start()
        db = Database(running.db.url)
        with db.transaction() as session:
            create_user(session, "alice", "admin", PASSWORD)
        db.dispose()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def chromium(stack):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def test_a_thumbs_up_in_the_chat_page_shows_on_the_dashboard(stack, chromium):
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    chat = context.new_page()
    chat.goto(stack.emulator.url + "/")
    chat.select_option("#user-select", "zhangwei")
    chat.fill("#input", "年假有几天？")
    chat.click("#composer button[type=submit]")
    up = chat.locator(".card-button[data-key=feedback_up]")
    up.wait_for()  # the answer, then its card
    assert chat.locator(".card-title").first.inner_text() == "这个回答有帮助吗？"
    up.click()
    done = chat.locator(".card-done")
    done.wait_for()  # the app called update_template_card
    assert "👍" in done.inner_text()

    admin = context.new_page()
    web = f"http://127.0.0.1:{stack.web_port}"
    admin.goto(web + "/admin/login")
    admin.fill("input[name=name]", "alice")
    admin.fill("input[name=password]", PASSWORD)
    admin.click("button:has-text('Sign in')")
    admin.wait_for_load_state()
    admin.goto(web + "/admin/dashboard")
    assert admin.inner_text("#rated-up") == "1" and admin.inner_text("#rated-down") == "0"
    assert "100.0%" in admin.inner_text("#satisfaction-percent")
    assert "fake-glm" in admin.inner_text("#satisfaction-models")
    assert "no 👎" in admin.inner_text("#worst-rated")  # the admin's review list: nothing bad yet
    context.close()


def test_a_thumbs_up_under_an_ai_bot_answer_shows_on_the_dashboard_and_can_be_withdrawn(stack, chromium):
    from tests.support.stack import select_rows, wait_for

    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    chat = context.new_page()
    chat.goto(stack.emulator.url + "/")
    chat.select_option("#user-select", "lina")
    chat.select_option("#channel", "aibot")
    chat.fill("#input", "报销要几天？")
    chat.click("#composer button[type=submit]")
    up = chat.locator(".thumb-up")
    up.wait_for()  # the finished answer, whose first stream reply carried feedback.id
    up.click()
    chat.locator(".card-done").wait_for()
    assert "👍" in chat.locator(".card-done").inner_text()
    rated = "SELECT rating FROM answer_ratings WHERE channel = 'aibot'"
    wait_for(lambda: select_rows(stack.db.url, rated) == [{"rating": 1}], 30, 0.2, "the AI bot's 👍")

    admin = context.new_page()
    web = f"http://127.0.0.1:{stack.web_port}"
    admin.goto(web + "/admin/login")
    admin.fill("input[name=name]", "alice")
    admin.fill("input[name=password]", PASSWORD)
    admin.click("button:has-text('Sign in')")
    admin.wait_for_load_state()
    admin.goto(web + "/admin/dashboard")
    assert "aibot" in admin.inner_text("#satisfaction-channels")

    chat.locator(".thumb-withdraw").click()  # 撤销: WeCom's withdrawal, counted neither way
    chat.locator(".thumb-up").wait_for()
    wait_for(lambda: select_rows(stack.db.url, rated) == [{"rating": 0}], 30, 0.2, "the withdrawal")
    context.close()
