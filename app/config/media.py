"""Voice, images and files (worker/media/, docs/media.md): how much is fetched, and the speech and
vision models that read them."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr

from app.config.base import SettingsGroup
from app.config.secret_fields import SHARED, URL


class MediaSettings(SettingsGroup):
    media_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024,
                                 description="largest image, voice or file fetched from WeCom")
    media_url_hosts: str = Field(default="ww-aibot-img-1258476243.cos.ap-guangzhou.myqcloud.com",
                                 description="hosts an AI bot's image or file URL may name, comma-"
                                             "separated (*.example.com: its subdomains); a "
                                             "redirect is never followed")
    voice_max_duration_s: float = Field(default=90.0, gt=0, le=3600,
                                        description="longest voice clip transcribed, counted "
                                                    "before decoding (WeCom records at most 60 s)")
    asr_base_url: Annotated[str, URL] = Field(
        default="", description="OpenAI-compatible /v1 with /audio/transcriptions; empty: a voice "
                                "message gets a polite notice")
    asr_model: str = "whisper-1"
    asr_api_key: Annotated[SecretStr, SHARED] = SecretStr("")
    asr_language: str = Field(default="", description="a language hint for the ASR server (zh, en)")
    asr_timeout_s: float = Field(default=30.0, gt=0)
    vision_model: str = Field(default="", description="a vision model (GLM-4.6V) on the OpenAI-compatible "
                                                      "backend; empty: an image gets a polite notice")
    vision_base_url: Annotated[str, URL] = Field(
        default="", description="the vision model's /v1 when not OPENAI_BASE_URL")
    vision_api_key: Annotated[SecretStr, SHARED] = SecretStr("")
    vision_timeout_s: float = Field(default=120.0, gt=0)
    file_context_max_chars: int = Field(default=20000, ge=500,
                                        description="a conversation's file text kept for the prompt")
