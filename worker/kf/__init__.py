"""The worker's 微信客服 (kf) room: what differs when the asker is a customer, not an employee.

| module | what |
|--------|------|
| ``channel`` | before the answer: the event's sync, a person already serving, the window, "转人工", the kf budget; after it: a decline handed over |
| ``delivery`` | kf/send_msg within its rules, each message keyed by its own msgid, then the hand-over |
| ``budget`` | the channel's token budget a period, read from the usage ledger |
"""
