"""app/wecom/markdown.py: an answer's Markdown as WeCom's app markdown message (the subset it
renders kept, the rest rewritten to read well) or as plain text (every mark taken out), read
back through the emulator's rendering of WeCom (emulator/rendering.py): never a literal mark."""

from __future__ import annotations

import pytest

from app.wecom.markdown import for_markdown, has_markup, to_plain
from emulator.rendering import markdown_text

ANSWER = """## 住宿标准 Hotels

- 北京、上海：**600 RMB** 每晚
- 其他城市：*400 RMB*
  - 含早餐

| 城市 | 上限 |
|------|------|
| 杭州 | 500 |

```
kb add handbook.md
```
详见 [差旅制度](https://example.com/travel)，命令 `kb add`。
> 注意：~~旧标准~~已作废，<font color="warning">请重新审批</font>。"""

MARKS = ("**", "](", "| ", "```", "~~", "<font", "- ", "*4")


def test_markdown_keeps_what_wecom_renders_and_rewrites_the_rest():
    out = for_markdown(ANSWER)
    assert "## 住宿标准 Hotels" in out and "**600 RMB**" in out
    assert "[差旅制度](https://example.com/travel)" in out and "`kb add`" in out
    assert '> 注意：旧标准已作废，<font color="warning">请重新审批</font>。' in out
    assert "• 北京、上海" in out and "  ◦ 含早餐" in out and "400 RMB" in out and "*400" not in out
    assert "• 城市：杭州；上限：500" in out and "|" not in out
    assert "`kb add handbook.md`" in out and "```" not in out
    shown = markdown_text(out)  # what WeCom shows of it: no mark left over
    assert not any(mark in shown for mark in MARKS), shown
    assert "600 RMB" in shown and "差旅制度" in shown and "请重新审批" in shown


def test_plain_text_has_no_mark_and_keeps_the_words():
    out = to_plain(ANSWER)
    assert not any(mark in out for mark in MARKS), out
    assert "【住宿标准 Hotels】" in out and "600 RMB" in out and "差旅制度 (https://example.com/travel)" in out
    assert "kb add handbook.md" in out and "请重新审批" in out


@pytest.mark.parametrize("text", ["年假 10 天。", "2*3*4 = 24", "file_name_v2.pdf", "a > b 时", "C# 和 F#"])
def test_text_without_markup_is_left_alone(text):
    assert not has_markup(text) and to_plain(text) == text


@pytest.mark.parametrize("text", ["**粗**", "`x`", "[a](http://b)", "# 标题", "- 项", "> 引", "| a | b |",
                                  '<font color="info">x</font>'])
def test_markup_is_recognised(text):
    assert has_markup(text)


def test_list_items_run_together_on_one_line_read_as_items():
    """A chunk that joined a list's items with spaces (a long list cut at its sentences)."""
    run_on = ("- Maternity leave 产假: **158 days** (local rules). - Paternity leave 陪产假: **15 days**. "
              "- Childcare leave 育儿假: **5 days per year**.")
    assert for_markdown(run_on).split("\n") == [
        "• Maternity leave 产假: **158 days** (local rules).", "• Paternity leave 陪产假: **15 days**.",
        "• Childcare leave 育儿假: **5 days per year**."]
    assert to_plain("- Leave (apply in WeCom): - Annual leave: 10 days.").split("\n") == [
        "• Leave (apply in WeCom):", "• Annual leave: 10 days."]
    assert for_markdown("- 9 - 18 点上班") == "• 9 - 18 点上班"  # a range is not an item
