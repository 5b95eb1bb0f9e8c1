"""worker/media/images.py and prompt.py: an image as a content part beside the text, the budget's
estimate of it, and the conversation's files in the prompt."""

from __future__ import annotations

import base64

import pytest

from emulator import media as samples
from worker.media.errors import MediaFailure
from worker.media.images import image_part
from worker.media.prompt import for_estimate, with_files, with_images


def test_image_part_is_a_data_url_beside_the_text():
    part = image_part(samples.png_image())
    assert part["type"] == "image_url"
    head, b64 = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/png;base64" and base64.b64decode(b64) == samples.png_image()
    message = with_images({"role": "user", "content": "这是什么？"}, [part, part])
    assert message["content"][0] == {"type": "text", "text": "这是什么？"}
    assert [p["type"] for p in message["content"]] == ["text", "image_url", "image_url"]
    with pytest.raises(MediaFailure):
        image_part(b"%PDF-1.4 not an image")


def test_the_budget_estimate_counts_an_image_not_its_base64():
    from app.accounting import estimate_prompt_tokens

    big = image_part(samples.png_image(400, 300))
    messages = [{"role": "system", "content": "sys"}, with_images({"role": "user", "content": "q"}, [big])]
    assert estimate_prompt_tokens(for_estimate(messages)) < 3000 < estimate_prompt_tokens(messages)
    plain = [{"role": "user", "content": "q"}]
    assert for_estimate(plain) is plain


def test_files_go_after_the_system_prompt_newest_kept_when_short():
    files = [{"name": "old.txt", "text": "A" * 50}, {"name": "new.pdf", "text": "B" * 50}]
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    out = with_files(messages, files, max_chars=60)
    assert [m["role"] for m in out] == ["system", "system", "user"]
    assert "### new.pdf\n" + "B" * 50 in out[1]["content"] and "A" * 11 not in out[1]["content"]
    assert with_files(messages, [], 100) is messages
