"""An image the employee sent, as the vision model takes it: its type by its magic bytes (PNG,
JPEG, GIF, WebP; the declared content type is not trusted) and an OpenAI ``image_url`` content
part holding it as a data URL."""

from __future__ import annotations

import base64

from worker.media.errors import IMAGE_UNREADABLE, MediaFailure

IMAGE_TYPES = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF87a": "image/gif",
               b"GIF89a": "image/gif"}
DEFAULT_IMAGE_QUESTION = "请看看这张图片，告诉我上面有什么。Please look at this image and tell me what it shows."


def image_type(data: bytes) -> str | None:
    """The image's content type by its magic bytes (PNG, JPEG, GIF, WebP), or None."""
    for magic, kind in IMAGE_TYPES.items():
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def image_part(data: bytes) -> dict:
    """An OpenAI ``image_url`` content part holding the image as a data URL."""
    kind = image_type(data)
    if kind is None:
        raise MediaFailure("image: not PNG, JPEG, GIF or WebP", IMAGE_UNREADABLE)
    return {"type": "image_url",
            "image_url": {"url": f"data:{kind};base64,{base64.b64encode(data).decode('ascii')}"}}
