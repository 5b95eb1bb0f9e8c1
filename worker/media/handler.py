"""A message that is not plain text, turned into what the processor answers.

* **Voice** (the app's ``voice`` message): the AMR from ``media/get`` is decoded to 16 kHz mono
  WAV (``worker.media.audio``: AMR or MP3 only, at most ``VOICE_MAX_DURATION_S``, both checked
  before decoding) and transcribed (``worker.media.speech``). The employee is first sent what
  was heard ("🎤 ..."), then the answer to it. The AI bot's voice arrives as WeCom's own
  transcript and is answered as text (it never comes here).
* **Images** (the app's ``image``; the AI bot's ``image`` and ``mixed``): with ``VISION_MODEL``
  set, each image goes to that model as an ``image_url`` content part beside the employee's
  text, in the same message; without one, a polite notice (a ``mixed`` message with text is
  still answered from its text, with a note that its images were not seen).
* **Files** (PDF, DOCX, TXT, MD up to ``MEDIA_MAX_BYTES``): the knowledge base's parsers extract
  the text, which is kept for the conversation (``worker.media.files``); ``/forget`` drops it.

``MediaHandler.compose`` gives a ``Question`` when the model is to answer (the processor asks
it, then ``Question.reply`` puts the transcript or the images' note before the answer), or the
``Reply`` itself (a file read, a notice). Failures: ``worker.media.errors``; the vision model's
errors are the model's (``LLMError``), retried like any model call.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from app.knowledge import parsing
from worker.delivery.reply import Reply
from worker.media.audio import find_decoder, to_wav
from worker.media.audio_formats import AudioTooLong
from worker.media.errors import (
    FILE_UNREADABLE,
    FILE_UNSUPPORTED,
    IMAGES_OFF,
    VOICE_OFF,
    VOICE_SILENT,
    VOICE_TOO_LONG,
    VOICE_UNREADABLE,
    MediaFailure,
)
from worker.media.fetch import MediaFetcher
from worker.media.files import FileContexts
from worker.media.images import DEFAULT_IMAGE_QUESTION, image_part
from worker.media.speech import Transcriber

log = logging.getLogger(__name__)

#: The app callback's message types handled here (the AI bot's: by their URLs, ``handles``).
MEDIA_TYPES = ("image", "voice", "file")
FILE_TYPES = ("pdf", "docx", "text", "markdown")
HEARD_PREFIX = "🎤 "
MAX_TRANSCRIPT_CHARS = 600
MAX_IMAGES = 4  # of one AI bot message
IMAGES_SKIPPED = "（我暂时看不了图片，以下只根据文字回答。I can't view images yet; this answer is from your text.）\n\n"
FILE_READ = ("📄 我已读完《{name}》（{chars} 字{cut}）。接下来可以就这份文件提问；发送 /forget 让我忘掉它。\n"
             "I've read \"{name}\" ({chars} characters{cut_en}): ask me about it; /forget drops it.")


def handles(row, payload: dict) -> bool:
    """Whether this message is one for ``MediaHandler`` rather than plain text."""
    if row.channel == "aibot":
        return bool(payload.get("image_urls") or payload.get("file_url"))
    return row.msg_type in MEDIA_TYPES


@dataclass(frozen=True)
class Question:
    """What a media message asks the model: ``text`` (what was heard, or typed beside the
    images), the ``images`` as content parts, the model to ask (``llm``: the vision model; None:
    the chat model) and what goes ``before`` its answer."""

    text: str
    images: list[dict] | None = None
    llm: object = None
    before: str = ""

    def reply(self, answer: Reply) -> Reply:
        """The model's answer as the employee gets it."""
        return dataclasses.replace(answer, text=self.before + answer.text) if self.before else answer


class MediaHandler:
    """Turns a voice, image or file message into a ``Question`` for the model, or a ``Reply``."""

    def __init__(self, services, wecom, files: FileContexts):
        self.services = services
        self.settings = s = services.settings
        self.wecom = wecom
        self.files = files
        self.fetch = MediaFetcher(services, wecom)
        self.decoder = find_decoder()
        self.transcriber = (Transcriber(s.asr_base_url, s.asr_model, s.asr_api_key.get_secret_value(),
                                        s.asr_timeout_s, s.asr_language) if s.asr_base_url else None)
        self._vision = None
        if self.transcriber is not None:
            log.info("voice messages: decoder=%s asr=%s", self.decoder or "none", s.asr_base_url)

    @property
    def vision(self):
        if self._vision is None and self.settings.vision_model:
            from app.llm import OpenAIBackend  # noqa: PLC0415

            s = self.settings
            self._vision = OpenAIBackend(
                s.vision_base_url or s.openai_base_url, s.vision_model,
                (s.vision_api_key.get_secret_value() or s.openai_api_key.get_secret_value()),
                s.vision_timeout_s, reply_start=s.openai_reply_start)
        return self._vision

    def compose(self, row, user_id: str, payload: dict, lease, channel, conversation: str) -> Question | Reply:
        """What to answer; ``MediaUnavailable`` to retry. ``channel``: the message's delivery
        (``worker.delivery.channels``: a streamed answer carries what was heard itself)."""
        try:
            if row.msg_type == "voice":
                return self._voice(row, user_id, payload, lease, channel)
            if payload.get("file_url") or row.msg_type == "file":
                return self._file(row, payload, conversation)
            return self._images(row, payload, lease)
        except MediaFailure as exc:
            log.info("media message answered with a notice message_id=%s reason=%s", row.id, exc.reason)
            payload["content"] = None  # nothing for the conversation to keep
            return Reply(exc.notice, usage={"failure_reason": exc.reason[:120]})

    # -- voice -----------------------------------------------------------------------------------
    def _voice(self, row, user_id, payload, lease, channel) -> Question:
        if self.transcriber is None:
            raise MediaFailure("voice: ASR_BASE_URL not set", VOICE_OFF)
        fetched = self.fetch.from_wecom(payload.get("media_id") or "", accept=("audio/", "voice/",
                                                                               "application/octet-stream"))
        limit = self.settings.voice_max_duration_s
        try:
            wav = to_wav(fetched.data, self.decoder, max_duration_s=limit)
        except AudioTooLong as exc:
            raise MediaFailure(f"voice: {exc}"[:120], VOICE_TOO_LONG.format(limit=f"{limit:g}")) from None
        except ValueError as exc:
            raise MediaFailure(f"voice: {payload.get('format') or 'audio'} not decoded: {exc}"[:120],
                               VOICE_UNREADABLE) from None
        text = self.transcriber.transcribe(wav)[:MAX_TRANSCRIPT_CHARS]
        if not text:
            raise MediaFailure("voice: nothing heard", VOICE_SILENT)
        lease.check()
        payload["content"] = text  # the conversation keeps what was heard as the question
        heard = self._tell_heard(row, user_id, text, channel)
        return Question(text, before="" if heard else f"{HEARD_PREFIX}{text}\n\n")

    def _tell_heard(self, row, user_id: str, text: str, channel) -> bool:
        """Send "🎤 what was heard" ahead of the answer, once per message (a retry finds the mark;
        WeCom's duplicate check drops a resend whose first answer was lost). False: not sent,
        the answer carries it instead."""
        if channel.streams:
            return False
        mark = f"media:heard:{row.id}"
        try:
            if self.services.redis.exists(mark):
                return True
            self.wecom.send(user_id, "text", f"{HEARD_PREFIX}{text}",
                            duplicate_check_interval=self.settings.wecom_duplicate_check_s)
            self.services.redis.set(mark, "1", ex=86400)
            return True
        except Exception:  # noqa: BLE001 - the answer then begins with it
            log.warning("transcript not sent ahead of the answer message_id=%s", row.id)
            return False

    # -- images ----------------------------------------------------------------------------------
    def _images(self, row, payload, lease) -> Question:
        text = (payload.get("content") or "").strip()
        if self.vision is None:
            if text:  # a mixed message: its text still gets an answer
                return Question(text, before=IMAGES_SKIPPED)
            raise MediaFailure("image: VISION_MODEL not set", IMAGES_OFF)
        if row.channel == "aibot":
            keys = list(payload.get("media_keys") or ())
            urls = list(payload.get("image_urls") or ())[:MAX_IMAGES]
            images = [self.fetch.from_url(url, keys[i] if i < len(keys) else "").data for i, url in enumerate(urls)]
        else:
            images = [self.fetch.from_wecom(payload.get("media_id") or "", accept=("image/",)).data]
        parts = [image_part(data) for data in images]
        lease.check()
        payload["content"] = f"[图片 image] {text}".strip()
        return Question(text or DEFAULT_IMAGE_QUESTION, images=parts, llm=self.vision)

    # -- files -----------------------------------------------------------------------------------
    def _file(self, row, payload, conversation) -> Reply:
        if row.channel == "aibot":
            fetched = self.fetch.from_url(payload.get("file_url") or "", payload.get("file_key") or "")
        else:
            fetched = self.fetch.from_wecom(payload.get("media_id") or "")
        name = (payload.get("file_name") or fetched.filename or "").strip()
        try:
            parsed = parsing.parse(fetched.data, name or None, max_bytes=self.settings.media_max_bytes)
        except parsing.UploadError as exc:
            raise MediaFailure(f"file: {exc}"[:120], FILE_UNREADABLE.format(reason=exc)) from None
        if parsed.doc_type not in FILE_TYPES:
            raise MediaFailure(f"file: {parsed.doc_type} not taken", FILE_UNSUPPORTED)
        text = parsed.text
        limit = self.settings.file_context_max_chars
        cut = len(text) > limit
        name = name or {"pdf": "document.pdf", "docx": "document.docx", "markdown": "notes.md"}.get(
            parsed.doc_type, "notes.txt")
        self.files.add(conversation, row.id, name, text[:limit])
        log.info("file kept for the conversation message_id=%s type=%s chars=%d", row.id, parsed.doc_type,
                 len(text))
        return Reply(FILE_READ.format(name=name, chars=min(len(text), limit), cut="，只保留了开头" if cut else "",
                                      cut_en=", the beginning only" if cut else ""))
