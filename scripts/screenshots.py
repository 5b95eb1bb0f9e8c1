"""Screenshots of the admin pages for the README, from a demo site (seeded data, real gunicorn).

    python -m scripts.screenshots [--out docs/screenshots]

Serves ``tests/support/admin_site.AdminSite`` (a temp SQLite file, Redis DB 1) and captures, in
headless Chromium (``/usr/bin/chromium``): the dashboard (admin), the budgets list, the audit
search and the audit export form (auditor), as PNGs of the top of each page. The Chinese labels
need a CJK font on the machine (`apt-get install fonts-wqy-microhei`), else they show as boxes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.support.admin_site import PASSWORD, USERS, AdminSite

VIEWPORT = {"width": 1200, "height": 860}


def sign_in(page, role: str) -> None:
    page.goto("/admin/login")
    page.fill("input[name=name]", USERS[role])
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    page.wait_for_load_state()


def capture(site: AdminSite, out: Path) -> list[Path]:
    shots = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                             args=["--no-sandbox"])
        for role, pages in (("admin", [("dashboard", "/admin/dashboard"),
                                       ("budgets", "/admin/budgets")]),
                            ("auditor", [("audit-search", "/admin/audit?type=message_received"),
                                         ("audit-export", "/admin/audit")])):
            context = browser.new_context(base_url=site.url, viewport=VIEWPORT)
            page = context.new_page()
            sign_in(page, role)
            for name, path in pages:
                page.goto(path)
                if name == "dashboard":
                    page.wait_for_function("echarts.getInstanceByDom("
                                           "document.getElementById('chart-models'))")
                    page.wait_for_timeout(1200)  # let the charts' intro animation finish
                if name == "audit-export":
                    page.fill("textarea[name=reason]", "季度合规审查 quarterly compliance review")
                    page.focus("button:has-text('Export zip')")
                target = out / f"{name}.png"
                page.screenshot(path=str(target))
                shots.append(target)
            context.close()
        browser.close()
    return shots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/screenshots")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        site = AdminSite(Path(tmp))
        try:
            for shot in capture(site, out):
                print(f"{shot} ({shot.stat().st_size // 1024} KiB)")
        finally:
            site.stop()


if __name__ == "__main__":
    main()
