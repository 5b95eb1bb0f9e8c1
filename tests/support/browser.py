"""The browser tests' fixtures (marker ``browser``; a plugin: tests/conftest.py registers it):
real headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright) against the
admin site served by gunicorn over seeded demo data (``tests/support/admin_site.py``).

One site and one browser per module; each test gets its own browser context (fresh cookies).
Skipped, with the reason, only where ``/usr/bin/chromium`` is missing (``.ci/run`` installs it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from tests.support.admin_site import PASSWORD, USERS, AdminSite

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)")
    server = AdminSite(tmp_path_factory.mktemp("admin-site"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser(site):
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, site):
    context = browser.new_context(base_url=site.url, accept_downloads=True,
                                  viewport={"width": 1280, "height": 900})
    context.set_default_timeout(15_000)
    yield context.new_page()
    context.close()


def sign_in(page, role: str) -> None:
    page.goto("/admin/login")
    page.fill("input[name=name]", USERS[role])
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_load_state()
    assert "/admin/login" not in page.url, page.content()
