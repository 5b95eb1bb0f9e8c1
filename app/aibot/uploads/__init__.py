"""Images and files the AI bot sends back over its long connection (``aibot_upload_media_*``).

Like a push (``app.aibot.pushes``), a media message is handed from any process to the one that
holds the connection through Redis (``queue.MediaPushes``); the holder uploads it with the
three-step protocol (init, chunks, finish: ``upload.Upload``) and sends the ``media_id`` it gets
with ``aibot_send_msg``. docs/aibot.md, "Images and files back".
"""

from app.aibot.uploads.queue import MediaPush, MediaPushes
from app.aibot.uploads.upload import Upload, UploadFailed

__all__ = ["MediaPush", "MediaPushes", "Upload", "UploadFailed"]
