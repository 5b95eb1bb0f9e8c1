"""The speech-to-text client: an OpenAI-compatible ``POST {base}/audio/transcriptions``
(Whisper, GLM-ASR behind vLLM) at ``ASR_BASE_URL``.

A server that is down, slow or busy (5xx, 429) is ``MediaUnavailable``: the message is retried
later; one that refuses the clip is a ``MediaFailure`` with the "could not play" notice.
"""

from __future__ import annotations

import requests

from worker.media.errors import VOICE_UNREADABLE, MediaFailure, MediaUnavailable


class Transcriber:
    def __init__(self, base_url: str, model: str, api_key: str = "", timeout_s: float = 30.0,
                 language: str = "", session: requests.Session | None = None):
        self.url = base_url.rstrip("/") + "/audio/transcriptions"
        self.model, self.language = model, language
        self.timeout = (3.05, timeout_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.session = session or requests.Session()

    def transcribe(self, wav: bytes) -> str:
        fields = {"model": self.model, "response_format": "json"}
        if self.language:
            fields["language"] = self.language
        try:
            resp = self.session.post(self.url, data=fields, files={"file": ("voice.wav", wav, "audio/wav")},
                                     headers=self.headers, timeout=self.timeout)
        except requests.RequestException as exc:
            raise MediaUnavailable(f"asr: {type(exc).__name__}") from None
        if resp.status_code >= 500 or resp.status_code == 429:
            raise MediaUnavailable(f"asr: HTTP {resp.status_code}")
        if resp.status_code != 200:
            raise MediaFailure(f"asr: refused ({resp.status_code})", VOICE_UNREADABLE)
        try:
            text = resp.json().get("text")
        except (ValueError, AttributeError):
            raise MediaUnavailable("asr: answer is not JSON") from None
        return text.strip() if isinstance(text, str) else ""
