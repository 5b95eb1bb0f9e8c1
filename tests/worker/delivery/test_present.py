"""The app channel's presentation (worker/delivery/message_send.py ``present``): Markdown as
WeCom's markdown message, anything else as text without marks; WECOM_MARKDOWN=false: text always;
the AI bot's stream as composed."""

from __future__ import annotations

from types import SimpleNamespace

from worker.delivery.message_send import MessageSend
from worker.delivery.reply import Reply
from worker.delivery.stream import StreamDelivery


def channel(markdown: bool = True) -> MessageSend:
    return MessageSend(SimpleNamespace(settings=SimpleNamespace(wecom_markdown=markdown)), wecom=None)


def test_markdown_goes_as_markdown_and_text_as_text():
    shown = channel().present(Reply("- 北京：**600 RMB**"))
    assert (shown.kind, shown.text) == ("markdown", "• 北京：**600 RMB**")
    plain = channel().present(Reply("年假 10 天。", usage={"model": "m"}))
    assert (plain.kind, plain.text, plain.usage) == ("text", "年假 10 天。", {"model": "m"})


def test_without_markdown_the_marks_are_taken_out():
    shown = channel(markdown=False).present(Reply("- 北京：**600 RMB**，见 [制度](https://x.example)"))
    assert (shown.kind, shown.text) == ("text", "• 北京：600 RMB，见 制度 (https://x.example)")


def test_nothing_to_send_and_the_stream_are_left_alone():
    assert channel().present(Reply.nothing()) == Reply.nothing()
    assert StreamDelivery(writer=None).present(Reply("**x**")).text == "**x**"
