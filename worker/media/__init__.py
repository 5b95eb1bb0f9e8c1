"""Voice, images and files: what the worker does with a message that is not plain text.

One module a job:

- ``handler``: ``MediaHandler`` turns a media message into a ``Question`` for the model (what
  was heard, the text beside the images) or a ``Reply`` (a file read, a polite notice);
- ``fetch``: the bytes, from WeCom's ``media/get`` or an AI bot URL (no redirects, allow-listed
  hosts, at most ``MEDIA_MAX_BYTES``), decrypted with the message's key;
- ``audio_formats`` and ``audio``: which audio is taken (AMR, MP3) and how long it lasts, read
  from the bytes before anything is decoded; then the decoding to 16 kHz mono WAV;
- ``speech``: the speech-to-text client (an OpenAI-compatible ``/audio/transcriptions``);
- ``images``: an image's type by its magic bytes, as a content part for the vision model;
- ``files``: the conversation's files (sealed in Redis) and ``/forget``;
- ``file_questions``: files first: whether a question is about the conversation's files, and
  the files as passages the answer cites by name;
- ``prompt``: the files and images put into the model's messages, and the budget's estimate;
- ``errors``: how a media message fails (``MediaFailure``: a notice; ``MediaUnavailable``: retry).

Nothing is imported here: a module of the room is imported by its own name.
"""
