"""The outbox: the durable queue between the callbacks and the worker.

- ``rows``: the ``inbound_messages`` rows (what an arrival becomes, the group commit's insert, the
  worker's claim, lease, progress and finish, the sweeper's queries);
- ``statements``: plain SQL on the driver's cursor for the hot writes (used by ``rows`` and the
  audit chain);
- ``publisher``: the worker's task published for new rows, the one way both channels use.
"""
