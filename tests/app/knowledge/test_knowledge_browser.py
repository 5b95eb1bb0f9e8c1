"""The knowledge base page in headless Chromium: upload a document, find it in the retrieval
test box, delete it."""

from __future__ import annotations

import pytest

from tests.support.browser import sign_in

pytestmark = pytest.mark.browser

POLICY = """# 差旅制度

## 住宿标准
一线城市住宿标准为每晚 600 元，其他城市每晚 450 元，超出部分需部门负责人审批。
"""


def test_upload_search_and_delete_a_document(page, site, tmp_path):
    document = tmp_path / "travel.md"
    document.write_text(POLICY, encoding="utf-8")
    sign_in(page, "admin")
    page.goto("/admin/knowledge")
    page.set_input_files("#upload input[name=file]", str(document))
    page.fill("#upload input[name=title]", "差旅制度")
    page.click("#upload button[type=submit]")
    page.wait_for_load_state()
    assert "1 chunks" in page.inner_text(".flash")
    row = page.locator("#documents tr", has_text="差旅制度")
    assert row.count() == 1 and "everyone" in row.inner_text()

    page.fill("#search textarea[name=question]", "一线城市的住宿标准是每晚多少？")
    page.click("#search button[type=submit]")
    page.wait_for_load_state()
    results = page.inner_text("#results")
    assert "每晚 600 元" in results and "差旅制度 › 住宿标准" in results
    assert "could not find it" not in results

    page.on("dialog", lambda dialog: dialog.accept())  # the "delete this document?" confirm
    page.locator("#documents tr", has_text="差旅制度").locator("button:has-text('delete')").click()
    page.wait_for_load_state()
    assert "deleted" in page.inner_text(".flash")
    assert page.locator("#documents tr", has_text="差旅制度").count() == 0
    page.fill("#search textarea[name=question]", "一线城市的住宿标准是每晚多少？")
    page.click("#search button[type=submit]")
    page.wait_for_load_state()
    assert "could not find it" in page.inner_text("#results")
