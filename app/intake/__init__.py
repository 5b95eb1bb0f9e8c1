"""The intake: how an accepted callback becomes a durable outbox row, in the order a message takes.

- ``protocol``: what the callbacks call (``Intake.accept``) and the one error they answer 503 for;
- ``client``: under gunicorn, a web process sends its message to the intake server ...
- ``wire``: ... in the frames both ends encode and decode with this one codec;
- ``server``: one process writes every web process's messages, a batch per transaction;
- ``local``: the batch writer both the server and a process without one use (``LocalIntake``);
- ``batching``: the thread that turns what is waiting into one batch.

The rows, the SQL they are written with and the publishing of their tasks are ``app.outbox``.
"""
