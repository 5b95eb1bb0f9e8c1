"""Real media bytes the emulator serves from ``media/get``, made here without any file on disk.

* ``amr_clip()``: a short AMR-NB clip as WeCom's voice messages are (``#!AMR\\n`` magic, then
  20 ms frames). PyAV encodes a 440 Hz tone with libopencore_amrnb when its FFmpeg build has
  it; otherwise the clip is built by hand from 12.2 kbit/s frames (header byte ``0x3C``: frame
  type 7, quality bit set, then 31 payload bytes) which every AMR-NB decoder accepts.
* ``png_image()``: a small RGB PNG (zlib + CRC, the format's own rules);
* ``pdf_document(lines)``: a one-page PDF whose text pypdf extracts.

The same functions make the tests' fixtures, so what the app receives is what the tests check.

``MediaStore`` holds them (and anything a test uploads) by media_id for 3 days, as WeCom keeps a
temporary media: ``GET /cgi-bin/media/get`` answers the bytes with ``Content-Type`` and
``Content-disposition: attachment; filename="..."``, or errcode 40007 for an unknown or expired
id (``POST /_emulator/media/<id>/expire`` ends one early). The AI bot's image and file URLs point
at ``GET /_emulator/aibot/media/<id>``: the same bytes AES-encrypted with the bot's
EncodingAESKey, as WeCom's are; over the long connection each carries its own ``aeskey``, which
its URL names (``?aeskey=``) and seals it with instead.
"""

from __future__ import annotations

import base64
import io
import math
import secrets
import struct
import threading
import time
import zlib
from urllib.parse import quote

from flask import Blueprint, Response, current_app, jsonify, request

AMR_MAGIC = b"#!AMR\n"
AMR_FRAME_122 = bytes([0x3C]) + bytes(31)  # one 20 ms frame of mode 12.2, silent-ish payload
SAMPLE_PDF_LINES = ["Emulator travel policy", "Hotels in Beijing: up to 600 RMB per night."]


def amr_clip(seconds: float = 1.0) -> bytes:
    """An AMR-NB file of about ``seconds`` seconds (8 kHz mono)."""
    try:
        return _encoded_tone(seconds)
    except Exception:  # noqa: BLE001 - no PyAV, or an FFmpeg without the AMR encoder
        return handmade_amr(seconds)


def handmade_amr(seconds: float = 1.0) -> bytes:
    return AMR_MAGIC + AMR_FRAME_122 * max(1, int(seconds * 50))


def _encoded_tone(seconds: float) -> bytes:
    import av  # noqa: PLC0415 - optional: the emulator runs without it
    import numpy as np  # noqa: PLC0415

    out = io.BytesIO()
    with av.open(out, "w", format="amr") as container:
        stream = container.add_stream("libopencore_amrnb", rate=8000)
        stream.bit_rate = 12200
        stream.layout = "mono"
        samples = int(8000 * seconds)
        t = np.arange(samples) / 8000
        pcm = (0.3 * 32767 * np.sin(2 * math.pi * 440 * t)).astype(np.int16).reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = 8000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    data = out.getvalue()
    if not data.startswith(AMR_MAGIC):
        raise ValueError("the encoder wrote no AMR file")
    return data


def png_image(width: int = 32, height: int = 24) -> bytes:
    """A ``width`` x ``height`` RGB PNG: a red-to-blue gradient."""
    rows = b"".join(b"\x00" + b"".join(bytes((255 * x // max(1, width - 1), 64, 255 - 255 * x // max(1, width - 1)))
                                       for x in range(width)) for _ in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


def pdf_document(lines: list[str] | None = None) -> bytes:
    """A valid one-page PDF with ``lines`` of text (Helvetica; ASCII), offsets computed."""
    lines = lines or SAMPLE_PDF_LINES
    escaped = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in lines]
    text = "BT /F1 12 Tf 72 720 Td " + " ".join(f"({line}) Tj 0 -16 Td" for line in escaped) + " ET"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(text) + text.encode("latin-1") + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


#: media_id -> (bytes, content type, file name) the emulator holds from the start.
def samples() -> dict[str, tuple[bytes, str, str]]:
    return {
        "emulator-voice": (amr_clip(), "audio/amr", "voice.amr"),
        "emulator-image": (png_image(), "image/png", "image.png"),
        "emulator-file": (pdf_document(), "application/pdf", "policy.pdf"),
    }


MEDIA_TTL_S = 3 * 86400


class MediaStore:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.lock = threading.Lock()
        self.items: dict[str, dict] = {}
        for media_id, (data, content_type, filename) in samples().items():
            self.put(data, content_type, filename, media_id=media_id)

    def put(self, data: bytes, content_type: str, filename: str = "", media_id: str | None = None) -> str:
        media_id = media_id or "emu-" + secrets.token_urlsafe(24)
        with self.lock:
            self.items[media_id] = {"data": data, "content_type": content_type, "filename": filename,
                                    "expires": self.clock() + MEDIA_TTL_S}
            while len(self.items) > 200:
                self.items.pop(next(iter(self.items)))
        return media_id

    def get(self, media_id: str) -> dict | None:
        with self.lock:
            item = self.items.get(media_id)
            return item if item is not None and item["expires"] > self.clock() else None

    def expire(self, media_id: str) -> bool:
        with self.lock:
            item = self.items.get(media_id)
            if item is not None:
                item["expires"] = 0.0
            return item is not None


bp = Blueprint("wecom_media", __name__)


def store() -> MediaStore:
    return current_app.extensions["wecom_emulator_media"]


@bp.get("/cgi-bin/media/get")
def media_get():
    from emulator import api  # noqa: PLC0415 - api imports nothing of this module

    st = api.state()
    fault = st.pop_fault("media/get")
    if fault and fault.delay:
        st.stopping.wait(fault.delay)
    if fault and fault.http_status:
        st.count("media/get", http_status=fault.http_status)
        return Response(f"<html><body><h1>{fault.http_status}</h1></body></html>",
                        status=fault.http_status, mimetype="text/html")
    if fault and fault.errcode is not None:
        return _error(fault.errcode, fault.errmsg)
    code = st.check_token(request.args.get("access_token"))
    if code:
        return _error(code)
    media_id = request.args.get("media_id", "")
    item = store().get(media_id) if media_id else None
    if item is None:
        return _error(40007) if media_id else _error(41006, "media_id missing")
    st.count("media/get", errcode=0)
    response = Response(item["data"], mimetype=item["content_type"])
    if item["filename"]:
        response.headers["Content-disposition"] = f'attachment; filename="{quote(item["filename"])}"'
    return response


def _error(code: int, errmsg: str | None = None):
    from emulator import api  # noqa: PLC0415

    body = api.error(code, errmsg)
    api.state().count("media/get", errcode=code)
    return jsonify(body)


@bp.post("/_emulator/media")
def media_upload():
    """{"data_b64", "content_type", "filename"?} -> {"media_id"}: a media for a callback to name."""
    body = request.get_json(silent=True) or {}
    try:
        data = base64.b64decode(body.get("data_b64") or "", validate=True)
    except (ValueError, TypeError):
        return jsonify(error="data_b64 must be base64"), 400
    content_type = str(body.get("content_type") or "application/octet-stream")
    return jsonify(media_id=store().put(data, content_type, str(body.get("filename") or "")))


@bp.post("/_emulator/media/<media_id>/expire")
def media_expire(media_id: str):
    return jsonify(expired=store().expire(media_id))


@bp.get("/_emulator/aibot/media/<media_id>")
def aibot_media(media_id: str):
    from app.wecom.crypto import decode_aes_key, encrypt_media  # noqa: PLC0415

    item = store().get(media_id)
    cfg = current_app.extensions["wecom_emulator"].config
    key = _own_key(request.args.get("aeskey", ""))  # the long connection's, given in its message
    if key is None and cfg.aibot_aes_key:
        key = decode_aes_key(cfg.aibot_aes_key)
    if item is None or key is None:
        return Response("not found", status=404)
    data = encrypt_media(key, item["data"])
    return Response(data, mimetype="application/octet-stream")


def _own_key(text: str) -> bytes | None:
    try:
        key = base64.b64decode(text, validate=True) if text else b""
    except ValueError:
        return None
    return key if len(key) == 32 else None
