"""Voice, images and files: what the worker does with a message that is not plain text.

* **Voice** (the app's ``voice`` message): the AMR from ``media/get`` is decoded to 16 kHz mono
  WAV (PyAV; Debian's ``ffmpeg`` when PyAV is missing; which one is found once, at start-up) and
  sent to an OpenAI-compatible ``/audio/transcriptions`` server (``ASR_BASE_URL``). The employee
  is first sent what was heard ("🎤 ..."), then the answer to it. The AI bot's voice arrives as
  WeCom's own transcript and is answered as text (it never comes here).
* **Images** (the app's ``image``; the AI bot's ``image`` and ``mixed``): with ``VISION_MODEL``
  set, each image goes to that model as an ``image_url`` content part (a data URL) beside the
  employee's text, in the same message; without one, a polite notice (a ``mixed`` message with
  text is still answered from its text, with a note that its images were not seen).
* **Files** (PDF, DOCX, TXT, MD up to ``MEDIA_MAX_BYTES``): the knowledge base's parsers extract
  the text, which is kept for the conversation (sealed in Redis like the conversation, same TTL)
  and put before the employee's next questions in the prompt; ``/forget`` drops it.

Failures: anything that cannot succeed (too large, a type or codec not handled, an expired
media id, an unreadable file, nothing heard) is a ``MediaFailure``: the employee gets its polite
notice and the outbox row its reason (status answered). A server that is down or slow (WeCom, the
ASR server, an image URL) is ``MediaUnavailable``: the processor retries the message with backoff
and after the last attempt records it failed, after the failure notice. The vision model's errors
are the model's (``LLMError``), retried the same way.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import logging
import shutil
import subprocess
import wave
from dataclasses import dataclass

import redis
import requests

from app.knowledge import parsing
from app.security import FieldDecryptError
from app.wecom.client import read_limited
from app.wecom.crypto import decrypt_media
from app.wecom.exceptions import (
    InvalidMediaError,
    MediaRejectedError,
    WeComAPIError,
    WeComCryptoError,
    WeComTransientError,
)
from worker import commands
from worker.reply import Reply

log = logging.getLogger(__name__)

#: The app callback's message types handled here (the AI bot's: by their URLs, ``handles``).
MEDIA_TYPES = ("image", "voice", "file")
FILE_TYPES = ("pdf", "docx", "text", "markdown")
IMAGE_TYPES = {b"\x89PNG\r\n\x1a\n": "image/png", b"\xff\xd8\xff": "image/jpeg", b"GIF87a": "image/gif",
               b"GIF89a": "image/gif"}
MAX_FILES = 5  # per conversation; the oldest goes first
HEARD_PREFIX = "🎤 "
DEFAULT_IMAGE_QUESTION = "请看看这张图片，告诉我上面有什么。Please look at this image and tell me what it shows."
MAX_TRANSCRIPT_CHARS = 600

VOICE_OFF = ("语音识别暂未开通，请用文字发送你的问题。\n"
             "Voice messages are not set up yet; please type your question.")
VOICE_UNREADABLE = ("抱歉，这条语音我无法识别（格式不支持或已损坏），请用文字再发一次。\n"
                    "Sorry, I could not play this voice message; please type your question.")
VOICE_SILENT = ("抱歉，这条语音里我没有听清内容，请再说一次或改用文字。\n"
                "Sorry, I could not make out any words; please try again or type it.")
IMAGES_OFF = ("我暂时还看不了图片，请用文字描述图片里的内容。\n"
              "I can't view images yet; please describe the image in words.")
IMAGES_SKIPPED = "（我暂时看不了图片，以下只根据文字回答。I can't view images yet; this answer is from your text.）\n\n"
IMAGE_UNREADABLE = ("抱歉，这张图片我打不开（只支持 PNG、JPEG、GIF），请换一张再试。\n"
                    "Sorry, I could not open this image (PNG, JPEG or GIF only).")
TOO_LARGE = ("抱歉，这个文件太大了（上限 {limit}），请发送小一点的文件。\n"
             "Sorry, that is too large for me (the limit is {limit}).")
EXPIRED = ("抱歉，这个文件已过期或无法下载，请重新发送。\n"
           "Sorry, that file has expired or could not be fetched; please send it again.")
FILE_UNSUPPORTED = ("抱歉，我只能阅读 PDF、Word（DOCX）、TXT 和 Markdown 文件。\n"
                    "Sorry, I can only read PDF, Word (DOCX), TXT and Markdown files.")
FILE_UNREADABLE = "抱歉，这个文件我读不了：{reason}\nSorry, I could not read this file: {reason}"
FILE_READ = ("📄 我已读完《{name}》（{chars} 字{cut}）。接下来可以就这份文件提问；发送 /forget 让我忘掉它。\n"
             "I've read \"{name}\" ({chars} characters{cut_en}): ask me about it; /forget drops it.")


class MediaFailure(Exception):
    """Cannot succeed: the employee gets ``notice``, the outbox row ``reason``."""

    def __init__(self, reason: str, notice: str):
        super().__init__(reason)
        self.reason, self.notice = reason, notice


class MediaUnavailable(Exception):
    """A server on the way (WeCom, the ASR server, an image URL) is down or slow: retry later."""


@dataclass(frozen=True)
class Fetched:
    data: bytes
    content_type: str = ""
    filename: str = ""


def handles(row, payload: dict) -> bool:
    """Whether this message is one for ``MediaHandler`` rather than plain text."""
    if row.channel == "aibot":
        return bool(payload.get("image_urls") or payload.get("file_url"))
    return row.msg_type in MEDIA_TYPES


def _megabytes(n: int) -> str:
    return f"{n / 1048576:.0f} MB" if n >= 1048576 else f"{n // 1024} KB"


def media_key(text: str) -> bytes | None:
    """A message's own ``aeskey`` (base64, standard or URL-safe, padding optional) as 32 bytes."""
    padded = text.strip() + "=" * (-len(text.strip()) % 4)
    for decode in (base64.b64decode, base64.urlsafe_b64decode):
        try:
            key = decode(padded)
        except ValueError:
            continue
        if len(key) == 32:
            return key
    return None


# -- audio -----------------------------------------------------------------------------------------
def find_decoder() -> str | None:
    """``"pyav"``, ``"ffmpeg"`` (its path) or None: what decodes AMR here."""
    try:
        import av  # noqa: F401, PLC0415

        return "pyav"
    except ImportError:
        pass
    return shutil.which("ffmpeg")


def to_wav(data: bytes, decoder: str | None, rate: int = 16000, timeout_s: float = 30.0) -> bytes:
    """The audio in ``data`` (AMR, or anything the decoder knows) as 16-bit mono WAV at ``rate``;
    ``ValueError`` when it cannot be decoded."""
    if decoder is None:
        raise ValueError("no audio decoder (install PyAV, or ffmpeg)")
    if decoder == "pyav":
        return _wav_pyav(data, rate)
    try:
        done = subprocess.run([decoder, "-hide_banner", "-loglevel", "error", "-i", "pipe:0", "-ac", "1",
                               "-ar", str(rate), "-f", "wav", "pipe:1"], input=data, capture_output=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ValueError("ffmpeg took too long") from None
    if done.returncode != 0 or len(done.stdout) <= 44:
        raise ValueError(f"ffmpeg could not decode it: {done.stderr.decode(errors='replace')[-120:]}")
    return done.stdout


def _wav_pyav(data: bytes, rate: int) -> bytes:
    import av  # noqa: PLC0415

    pcm = bytearray()
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise ValueError("no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=rate)
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    pcm += bytes(out.planes[0])[: out.samples * 2]
            for out in resampler.resample(None):
                pcm += bytes(out.planes[0])[: out.samples * 2]
    except av.error.FFmpegError as exc:
        raise ValueError(f"cannot decode: {type(exc).__name__}") from None
    if not pcm:
        raise ValueError("no audio in it")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(bytes(pcm))
    return out.getvalue()


class Transcriber:
    """An OpenAI-compatible ``POST {base}/audio/transcriptions`` (Whisper, GLM-ASR behind vLLM)."""

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


# -- images ----------------------------------------------------------------------------------------
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


def with_images(message: dict, parts: list[dict]) -> dict:
    """The user message with its text and image parts together, text first."""
    text = message.get("content")
    if isinstance(text, list):
        return {**message, "content": [*text, *parts]}
    return {**message, "content": [{"type": "text", "text": text or DEFAULT_IMAGE_QUESTION}, *parts]}


#: What an image stands for in the budget's prompt estimate (its bytes): a vision model spends a
#: bounded number of tokens an image (GLM-4V about 1,600 at most), not its base64's length.
IMAGE_ESTIMATE = "#" * 2048


def for_estimate(messages: list[dict]) -> list[dict]:
    """``messages`` with each image part counted as ``IMAGE_ESTIMATE`` rather than its data URL
    (the reservation is settled against the server's own token counts afterwards)."""
    if not any(isinstance(m.get("content"), list) for m in messages):
        return messages
    return [{**m, "content": [{"type": "text", "text": IMAGE_ESTIMATE} if p.get("type") == "image_url" else p
                              for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in messages]


# -- files -----------------------------------------------------------------------------------------
class FileContexts:
    """The files of one conversation: a Redis list of sealed ``{"name", "text", "ref"}``, the
    conversation's TTL, at most ``MAX_FILES`` (the oldest dropped)."""

    def __init__(self, client, cipher, ttl_s: int):
        self.redis, self.cipher, self.ttl_s = client, cipher, ttl_s

    @staticmethod
    def _key(conversation: str) -> str:
        return f"conv-files:{conversation}"

    def add(self, conversation: str, ref: int, name: str, text: str) -> None:
        key = self._key(conversation)
        if any(f.get("ref") == ref for f in self.files(conversation)):
            return  # a retried task
        sealed = self.cipher.encrypt(json.dumps({"name": name, "text": text, "ref": ref}, ensure_ascii=False),
                                     "redis", "conversation-file", key)
        pipe = self.redis.pipeline()
        pipe.rpush(key, sealed)
        pipe.ltrim(key, -MAX_FILES, -1)
        pipe.expire(key, self.ttl_s)
        pipe.execute()

    def files(self, conversation: str) -> list[dict]:
        key = self._key(conversation)
        found = []
        try:
            raws = self.redis.lrange(key, 0, -1)
        except redis.RedisError:
            log.warning("conversation files unavailable (Redis); answering without them")
            return []
        for raw in raws:
            try:
                found.append(json.loads(self.cipher.decrypt(raw.decode(), "redis", "conversation-file", key)))
            except (FieldDecryptError, ValueError):  # a key rotated away: that file is gone
                continue
        return found

    def drop(self, conversation: str) -> int:
        key = self._key(conversation)
        count = self.redis.llen(key)
        self.redis.delete(key)
        return int(count)


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


# -- the handler -----------------------------------------------------------------------------------
class MediaHandler:
    """Turns a voice, image or file message into a reply, through the processor's generation."""

    def __init__(self, processor):
        self.processor = processor
        self.services = processor.services
        self.settings = s = processor.services.settings
        self.decoder = find_decoder()
        self.files = FileContexts(self.services.redis, self.services.cipher, s.conversation_ttl_s)
        self.transcriber = (Transcriber(s.asr_base_url, s.asr_model, s.asr_api_key.get_secret_value(),
                                        s.asr_timeout_s, s.asr_language) if s.asr_base_url else None)
        self._vision = None
        self.http = requests.Session()
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

    def compose(self, row, user_id: str, payload: dict, lease, channel, conversation: str) -> Reply:
        """The reply, like ``MessageProcessor._compose``; ``MediaUnavailable`` to retry.
        ``channel``: the message's delivery (``worker.delivery``)."""
        try:
            if row.msg_type == "voice":
                return self._voice(row, user_id, payload, lease, channel, conversation)
            if payload.get("file_url") or row.msg_type == "file":
                return self._file(row, payload, conversation)
            return self._images(row, user_id, payload, lease, channel, conversation)
        except MediaFailure as exc:
            log.info("media message answered with a notice message_id=%s reason=%s", row.id, exc.reason)
            payload["content"] = None  # nothing for the conversation to keep
            return Reply(exc.notice, usage={"failure_reason": exc.reason[:120]})

    # -- fetching --------------------------------------------------------------------------------
    def _from_wecom(self, media_id: str, accept: tuple[str, ...] = ()) -> Fetched:
        limit = self.settings.media_max_bytes
        try:
            media = self.processor.wecom.get_media(media_id, max_bytes=limit, accept=accept)
        except InvalidMediaError as exc:
            raise MediaFailure(f"media: expired or unknown media_id ({exc.errcode})", EXPIRED) from None
        except MediaRejectedError as exc:
            if exc.too_large:
                raise MediaFailure(f"media: too large (over {limit} bytes)",
                                   TOO_LARGE.format(limit=_megabytes(limit))) from None
            raise MediaFailure(f"media: {exc.errmsg}"[:120], VOICE_UNREADABLE if "audio" in accept
                               else IMAGE_UNREADABLE) from None
        except WeComTransientError as exc:
            raise MediaUnavailable(f"wecom media/get: {exc}"[:120]) from None
        except WeComAPIError as exc:
            raise MediaFailure(f"media: wecom errcode {exc.errcode}", EXPIRED) from None
        return Fetched(media.data, media.content_type, media.filename)

    def _from_url(self, url: str, own_key: str = "") -> Fetched:
        """An AI bot image or file: fetched from its URL and decrypted with its own ``aeskey``
        (the long connection's), else the bot's EncodingAESKey."""
        key = media_key(own_key) if own_key else None
        if key is None and self.services.aibot_crypto is not None:
            key = self.services.aibot_crypto.key
        if key is None or not url.startswith(("https://", "http://")):
            raise MediaFailure("media: no AES key for it, or not an http(s) URL", EXPIRED)
        limit = self.settings.media_max_bytes
        try:
            resp = self.http.get(url, timeout=(3.05, 30), stream=True)
        except requests.RequestException as exc:
            raise MediaUnavailable(f"media url: {type(exc).__name__}") from None
        if resp.status_code >= 500 or resp.status_code == 429:
            resp.close()
            raise MediaUnavailable(f"media url: HTTP {resp.status_code}")
        if resp.status_code != 200:
            resp.close()
            raise MediaFailure(f"media url: HTTP {resp.status_code} (expired?)", EXPIRED)
        try:
            data = read_limited(resp, limit + 32, "media")  # + the padding
        except MediaRejectedError:
            raise MediaFailure(f"media: too large (over {limit} bytes)",
                               TOO_LARGE.format(limit=_megabytes(limit))) from None
        except requests.RequestException as exc:
            raise MediaUnavailable(f"media url: {type(exc).__name__}") from None
        try:
            return Fetched(decrypt_media(key, data))
        except WeComCryptoError:
            raise MediaFailure("media: not encrypted with the AI bot's key", EXPIRED) from None

    # -- voice -----------------------------------------------------------------------------------
    def _voice(self, row, user_id, payload, lease, channel, conversation) -> Reply:
        if self.transcriber is None:
            raise MediaFailure("voice: ASR_BASE_URL not set", VOICE_OFF)
        fetched = self._from_wecom(payload.get("media_id") or "", accept=("audio/", "voice/",
                                                                          "application/octet-stream"))
        try:
            wav = to_wav(fetched.data, self.decoder)
        except ValueError as exc:
            raise MediaFailure(f"voice: {payload.get('format') or 'audio'} not decoded: {exc}"[:120],
                               VOICE_UNREADABLE) from None
        text = self.transcriber.transcribe(wav)[:MAX_TRANSCRIPT_CHARS]
        if not text:
            raise MediaFailure("voice: nothing heard", VOICE_SILENT)
        lease.check()
        payload["content"] = text  # the conversation keeps what was heard as the question
        heard = self._tell_heard(row, user_id, text, channel)
        reply = self.processor._generate(row, text, lease, channel, user_id, conversation)
        return reply if heard else dataclasses.replace(reply, text=f"{HEARD_PREFIX}{text}\n\n{reply.text}")

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
            self.processor.wecom.send(user_id, "text", f"{HEARD_PREFIX}{text}",
                                      duplicate_check_interval=self.settings.wecom_duplicate_check_s)
            self.services.redis.set(mark, "1", ex=86400)
            return True
        except Exception:  # noqa: BLE001 - the answer then begins with it
            log.warning("transcript not sent ahead of the answer message_id=%s", row.id)
            return False

    # -- images ----------------------------------------------------------------------------------
    def _images(self, row, user_id, payload, lease, channel, conversation) -> Reply:
        text = (payload.get("content") or "").strip()
        if self.vision is None:
            if text:  # a mixed message: its text still gets an answer
                reply = self.processor._generate(row, text, lease, channel, user_id, conversation)
                return dataclasses.replace(reply, text=IMAGES_SKIPPED + reply.text)
            raise MediaFailure("image: VISION_MODEL not set", IMAGES_OFF)
        if row.channel == "aibot":
            keys = list(payload.get("media_keys") or ())
            urls = list(payload.get("image_urls") or ())[:4]
            images = [self._from_url(url, keys[i] if i < len(keys) else "").data for i, url in enumerate(urls)]
        else:
            images = [self._from_wecom(payload.get("media_id") or "", accept=("image/",)).data]
        parts = [image_part(data) for data in images]
        lease.check()
        question = text or DEFAULT_IMAGE_QUESTION
        payload["content"] = f"[图片 image] {text}".strip()
        return self.processor._generate(row, question, lease, channel, user_id, conversation,
                                        images=parts, llm=self.vision)

    # -- files -----------------------------------------------------------------------------------
    def _file(self, row, payload, conversation) -> Reply:
        if row.channel == "aibot":
            fetched = self._from_url(payload.get("file_url") or "", payload.get("file_key") or "")
        else:
            fetched = self._from_wecom(payload.get("media_id") or "")
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


@commands.register("forget", "忘掉我发来的文件 / drop the files I sent")
def _forget(context: commands.CommandContext) -> str:
    dropped = context.runtime.media.files.drop(context.conversation_key or context.user_hash)
    if not dropped:
        return "你还没有发给我文件。You have not sent me any file."
    return f"好的，我已忘掉你发来的 {dropped} 个文件。Done: I've forgotten the {dropped} file(s) you sent."
