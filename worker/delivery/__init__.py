"""Delivering a composed answer: what composing hands over, and the two channels that send it.

- ``reply``: the ``Reply`` value composing gives (text, kind, usage, how the row ends);
- ``channels``: the ``Delivery`` interface and ``Deliveries``, which picks one per row;
- ``message_send``: the app's answer through message/send, in recorded chunks, then the 👍/👎 card;
- ``stream``: the AI bot's answer written into its stream while the model generates
  (``stream_writer``: throttled, stopped at the stream's deadline);
- ``duplicate_check``: which message/send requests carry WeCom's duplicate check.

Nothing is imported here: a module of the room is imported by its own name.
"""
