"""The model: the bundled engine or an OpenAI-compatible server, and how replies are generated."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr

from app.config.base import SettingsGroup
from app.config.secret_fields import SHARED, URL


class ModelSettings(SettingsGroup):
    """Which backend answers (app/llm), the bundled engine's limits, and the generation."""

    inference_backend: Literal["engine", "openai"] = "engine"
    model_dir: str = "models/demo"
    engine_max_num_seqs: int = 64
    engine_max_model_len: int | None = None
    engine_kv_cache_bytes: int | None = None
    engine_speculative_k: int = Field(default=0, ge=0, le=8,
                                      description="MTP drafts per step for every chat (0 = plain decoding)")
    max_new_tokens: int = 512
    temperature: float = 0.7
    top_p: float = 0.9
    system_prompt: str = "你是企业微信里的公司助手，回答简洁、准确、礼貌。"


class OpenAISettings(SettingsGroup):
    """An OpenAI-compatible model server (``INFERENCE_BACKEND=openai``); its key is also the one
    the bundled ``inference serve`` requires, when set."""

    openai_base_url: Annotated[str, URL] = "http://127.0.0.1:8000/v1"
    openai_api_key: Annotated[SecretStr, SHARED] = SecretStr("")
    openai_model: str = "glm-4"
    openai_timeout_s: float = 120.0
    openai_reply_start: Literal["auto", "answer", "thinking"] = Field(
        default="auto", description="where a reply with inline thinking begins (app/llm/__init__.py)")
