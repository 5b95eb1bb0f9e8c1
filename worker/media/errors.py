"""How a media message fails, and what the employee is told.

Anything that cannot succeed (too large or too long, a type or codec not taken, an expired media
id, an unreadable file, nothing heard) is a ``MediaFailure``: the employee gets its polite notice
and the outbox row its reason (status answered). A server that is down or slow (WeCom, the ASR
server, an image URL) is ``MediaUnavailable``: the processor retries the message with backoff and
after the last attempt records it failed, after the failure notice.
"""

from __future__ import annotations

VOICE_OFF = ("语音识别暂未开通，请用文字发送你的问题。\n"
             "Voice messages are not set up yet; please type your question.")
VOICE_UNREADABLE = ("抱歉，这条语音我无法识别（格式不支持或已损坏），请用文字再发一次。\n"
                    "Sorry, I could not play this voice message; please type your question.")
VOICE_TOO_LONG = ("抱歉，这条语音太长了（上限 {limit} 秒），请分段发送或改用文字。\n"
                  "Sorry, that voice message is too long for me (the limit is {limit} seconds); "
                  "please send it in parts or type it.")
VOICE_SILENT = ("抱歉，这条语音里我没有听清内容，请再说一次或改用文字。\n"
                "Sorry, I could not make out any words; please try again or type it.")
IMAGES_OFF = ("我暂时还看不了图片，请用文字描述图片里的内容。\n"
              "I can't view images yet; please describe the image in words.")
IMAGE_UNREADABLE = ("抱歉，这张图片我打不开（只支持 PNG、JPEG、GIF），请换一张再试。\n"
                    "Sorry, I could not open this image (PNG, JPEG or GIF only).")
TOO_LARGE = ("抱歉，这个文件太大了（上限 {limit}），请发送小一点的文件。\n"
             "Sorry, that is too large for me (the limit is {limit}).")
EXPIRED = ("抱歉，这个文件已过期或无法下载，请重新发送。\n"
           "Sorry, that file has expired or could not be fetched; please send it again.")
FILE_UNSUPPORTED = ("抱歉，我只能阅读 PDF、Word（DOCX）、TXT 和 Markdown 文件。\n"
                    "Sorry, I can only read PDF, Word (DOCX), TXT and Markdown files.")
FILE_UNREADABLE = "抱歉，这个文件我读不了：{reason}\nSorry, I could not read this file: {reason}"


class MediaFailure(Exception):
    """Cannot succeed: the employee gets ``notice``, the outbox row ``reason``."""

    def __init__(self, reason: str, notice: str):
        super().__init__(reason)
        self.reason, self.notice = reason, notice


class MediaUnavailable(Exception):
    """A server on the way (WeCom, the ASR server, an image URL) is down or slow: retry later."""


def megabytes(n: int) -> str:
    """A byte limit as the employee reads it (``10 MB``, ``64 KB``)."""
    return f"{n / 1048576:.0f} MB" if n >= 1048576 else f"{n // 1024} KB"
