"""One media message through the three upload steps and the send, as a state machine the
connection's holder drives with WeCom's acks: each ack (matched by req_id) gives the next frame.

    init -> ack {upload_id} -> chunk 0 -> ack -> ... -> chunk n-1 -> ack -> finish
         -> ack {media_id} -> aibot_send_msg {msgtype, <type>: {media_id}} -> ack: done

One frame is in flight at a time (WeCom answers a req_id's frames in order; a chunk refused is
the upload's end). Any refusal raises ``UploadFailed`` naming the step and WeCom's errcode.
"""

from __future__ import annotations

from app.wecom import aibot_ws
from app.wecom.aibot_ws import Frame


class UploadFailed(RuntimeError):
    def __init__(self, step: str, errcode: int | None, errmsg: str = ""):
        super().__init__(f"{step} refused errcode={errcode} errmsg={errmsg[:80]!r}")
        self.step, self.errcode = step, errcode


class Upload:
    def __init__(self, key: str, chatid: str, kind: str, filename: str, data: bytes):
        self.key, self.chatid, self.kind, self.filename, self.data = key, chatid, kind, filename, data
        self.chunks = max(1, -(-len(data) // aibot_ws.UPLOAD_CHUNK_BYTES))
        self.upload_id: str | None = None
        self.media_id: str | None = None
        self.step = ""
        self.next_chunk = 0
        self.done = False
        self.req_id = ""

    def start(self) -> Frame:
        return self._out("init", aibot_ws.upload_init(self.kind, self.filename, self.data))

    def on_ack(self, ack: Frame) -> Frame | None:
        """The frame to send next, or None once the send was acknowledged (``done``)."""
        if ack.errcode:
            raise UploadFailed(self.step, ack.errcode, ack.errmsg)
        body = ack.body or {}
        if self.step == "init":
            self.upload_id = body.get("upload_id")
            if not isinstance(self.upload_id, str) or not self.upload_id:
                raise UploadFailed("init", None, "no upload_id in the ack")
            return self._chunk()
        if self.step == "chunk":
            return self._chunk() if self.next_chunk < self.chunks else self._out(
                "finish", aibot_ws.upload_finish(self.upload_id))
        if self.step == "finish":
            self.media_id = body.get("media_id")
            if not isinstance(self.media_id, str) or not self.media_id:
                raise UploadFailed("finish", None, "no media_id in the ack")
            return self._out("send", aibot_ws.send_media(self.chatid, self.kind, self.media_id))
        self.done = True
        return None

    def _chunk(self) -> Frame:
        frame = aibot_ws.upload_chunk(self.upload_id, self.next_chunk, self.data)
        self.next_chunk += 1
        return self._out("chunk", frame)

    def _out(self, step: str, frame: Frame) -> Frame:
        self.step, self.req_id = step, frame.req_id
        return frame
