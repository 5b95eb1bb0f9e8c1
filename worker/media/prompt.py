"""What the employee's media adds to the model's messages: the conversation's files as a system
message, the images beside the question, and the budget's estimate of an image.

The processor assembles the prompt (``MessageProcessor._generate``); these are the pieces it
takes from here.
"""

from __future__ import annotations

from worker.media.images import DEFAULT_IMAGE_QUESTION

#: What an image stands for in the budget's prompt estimate (its bytes): a vision model spends a
#: bounded number of tokens an image (GLM-4V about 1,600 at most), not its base64's length.
IMAGE_ESTIMATE = "#" * 2048


def with_images(message: dict, parts: list[dict]) -> dict:
    """The user message with its text and image parts together, text first."""
    text = message.get("content")
    if isinstance(text, list):
        return {**message, "content": [*text, *parts]}
    return {**message, "content": [{"type": "text", "text": text or DEFAULT_IMAGE_QUESTION}, *parts]}


def for_estimate(messages: list[dict]) -> list[dict]:
    """``messages`` with each image part counted as ``IMAGE_ESTIMATE`` rather than its data URL
    (the reservation is settled against the server's own token counts afterwards)."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return messages
    return [{**m, "content": [{"type": "text", "text": IMAGE_ESTIMATE} if p.get("type") == "image_url" else p
                              for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in messages]


def with_files(messages: list[dict], files: list[dict], max_chars: int) -> list[dict]:
    """``messages`` with the conversation's files as a system message after the first system
    message (newest files first when the budget is short)."""
    if not files:
        return messages
    parts, left = [], max_chars
    for f in reversed(files):
        if left <= 0:
            break
        text = f["text"][:left]
        parts.insert(0, f"### {f['name']}\n{text}")
        left -= len(text)
    context = ("员工在本次对话中发来了以下文件，回答时可以参考。\n"
               "The employee shared these files in this conversation; use them when relevant.\n\n"
               + "\n\n".join(parts))
    at = 1 if messages and messages[0].get("role") == "system" else 0
    return [*messages[:at], {"role": "system", "content": context}, *messages[at:]]
