"""The 微信客服 (WeCom customer service, "kf") channel: customers on WeChat answered by the bot.

- ``messages``: a customer's message from kf/sync_msg as the outbox stores it;
- ``sync``: the callback's ``kf_msg_or_event`` turned into outbox rows, from a stored cursor,
  exactly once across workers and restarts;
- ``rules``: what kf/send_msg allows (the 48-hour window, 5 messages a customer message) and
  when a customer asks for a person.

The worker's side (answering, handing over, the channel's budget) is ``worker.kf``; docs/kf.md.
"""
