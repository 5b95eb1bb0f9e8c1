"""WeCom's side of ``aibot_upload_media_init`` / ``chunk`` / ``finish`` on the AI bot's long
connection: a temporary image or file, uploaded in base64 pieces, kept under a ``media_id`` that
``aibot_send_msg`` can then send (``LongConnection._pushed``).

It refuses what WeCom refuses: an unknown type, a size under 5 bytes or over the type's limit,
more than 100 chunks, a chunk of an unknown upload, out of range or not base64, a finish before
every chunk arrived, and bytes whose MD5 is not the one announced. ``media`` keeps each finished
upload (type, file name, bytes) for the tests and the chat page.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
import threading
import time

from app.wecom import aibot_ws as proto

INVALID = 40058  # WeCom's "invalid parameter"
LIMITS = {"image": 10 * 1024 * 1024, "file": 20 * 1024 * 1024, "voice": 2 * 1024 * 1024,
          "video": 10 * 1024 * 1024}
MIN_BYTES = 5


class MediaUploads:
    def __init__(self, state):
        self.state = state
        self._lock = threading.Lock()
        self._open: dict[str, dict] = {}  # upload_id -> announced, chunks so far
        self.media: dict[str, dict] = {}  # media_id -> {type, filename, data, created_at}

    def handle(self, frame: proto.Frame) -> proto.Frame:
        body = frame.body or {}
        step = {proto.UPLOAD_INIT: self._init, proto.UPLOAD_CHUNK: self._chunk,
                proto.UPLOAD_FINISH: self._finish}[frame.cmd]
        problem, answer = step(body)
        self.state.bump("aibot_ws", f"{frame.cmd.removeprefix('aibot_')}_{'refused' if problem else 'ok'}")
        if problem:
            return proto.ack(frame.req_id, INVALID, problem)
        return proto.Frame("", frame.req_id, answer, 0, "ok")

    def _init(self, body: dict) -> tuple[str | None, dict | None]:
        kind, size, chunks = body.get("type"), body.get("total_size"), body.get("total_chunks")
        if kind not in LIMITS:
            return "invalid type", None
        if not isinstance(size, int) or not MIN_BYTES <= size <= LIMITS[kind]:
            return "invalid total_size", None
        if not isinstance(chunks, int) or not 1 <= chunks <= proto.MAX_UPLOAD_CHUNKS:
            return "invalid total_chunks", None
        if not isinstance(body.get("md5"), str) or not body.get("filename"):
            return "md5 and filename required", None
        upload_id = "up" + secrets.token_hex(12)
        with self._lock:
            self._open[upload_id] = {"type": kind, "filename": str(body["filename"]), "size": size,
                                     "total": chunks, "md5": body["md5"], "chunks": {}}
        return None, {"upload_id": upload_id}

    def _chunk(self, body: dict) -> tuple[str | None, dict | None]:
        with self._lock:
            upload = self._open.get(str(body.get("upload_id")))
        index = body.get("chunk_index")
        if upload is None:
            return "invalid upload_id", None
        if not isinstance(index, int) or not 0 <= index < upload["total"]:
            return "invalid chunk_index", None
        try:
            piece = base64.b64decode(str(body.get("base64_data") or ""), validate=True)
        except (binascii.Error, ValueError):
            return "base64_data is not base64", None
        if not piece:
            return "empty chunk", None
        with self._lock:
            upload["chunks"][index] = piece
        return None, None

    def _finish(self, body: dict) -> tuple[str | None, dict | None]:
        with self._lock:
            upload = self._open.pop(str(body.get("upload_id")), None)
        if upload is None:
            return "invalid upload_id", None
        if sorted(upload["chunks"]) != list(range(upload["total"])):
            return "chunks missing", None
        data = b"".join(upload["chunks"][i] for i in range(upload["total"]))
        if len(data) != upload["size"] or hashlib.md5(data).hexdigest() != upload["md5"]:  # noqa: S324
            return "size or md5 mismatch", None
        media_id = "3" + secrets.token_urlsafe(30)
        created_at = int(time.time())
        with self._lock:
            self.media[media_id] = {"type": upload["type"], "filename": upload["filename"],
                                    "data": data, "created_at": created_at}
        return None, {"type": upload["type"], "media_id": media_id, "created_at": created_at}

    def known(self, media_id: str, kind: str) -> bool:
        with self._lock:
            found = self.media.get(media_id)
        return found is not None and found["type"] == kind
