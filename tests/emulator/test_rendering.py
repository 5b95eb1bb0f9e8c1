"""emulator/rendering.py: what WeCom shows of a sent message, on the admin API (``shown``)."""

from __future__ import annotations

from emulator.rendering import shown


def test_a_text_message_shows_its_marks_as_typed():
    assert shown({"msgtype": "text", "content": "**600 RMB**"}) == "**600 RMB**"


def test_the_app_markdown_renders_only_wecoms_subset():
    content = "## 标题\n**粗** [链接](https://x) `code` <font color=\"info\">绿</font>\n> 引用\n- 列表 *斜*"
    assert shown({"msgtype": "markdown", "content": content}) == "标题\n粗 链接 code 绿\n引用\n- 列表 *斜*"
    assert shown({"msgtype": "markdown", "content": '<font color="red">x</font>'}) == '<font color="red">x</font>'


def test_the_ai_bots_stream_renders_common_markdown():
    content = "- 列表 *斜* **粗**\n```\nprint(1)\n```\n~~删~~"
    assert shown({"msgtype": "stream", "content": content, "source": "aibot_stream"}) == "• 列表 斜 粗\nprint(1)\n删"
    assert shown({"msgtype": "template_card", "content": None}) is None
