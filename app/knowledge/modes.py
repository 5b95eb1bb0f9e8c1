"""KB_MODE: what the bot does with a question the company's documents do not answer.

- ``strict`` (the default; right for the bundled demo model): it says so and names the team
  that owns the topic, without asking the model (a small model asked anyway would guess).
- ``open`` (for a capable model): the model answers as a general assistant, with the
  conversation but without any passage, and the reply ends with ``GENERAL_NOTE``, one line in
  both languages saying that the answer is not from company documents.

Only the "nothing found" branch differs: when passages are found both modes answer from them
with citations, and the passages are always those the asker (in a group, every member) may see.
A model that is shown passages and says they do not answer ("not found" in the rules' words) is
handled the same way: in strict mode the employee gets the decline; in open mode the model is
asked again without the passages and the general answer carries the note (one more call, only
then: the general answer never rests on passages it was told to stay within, and the note is
put on by us, not hoped for from the model).
"""

from __future__ import annotations

STRICT, OPEN = "strict", "open"
MODES = (STRICT, OPEN)

# What to do with a question (``route``).
GROUNDED = "grounded"  # answer from the passages (and the conversation's files), citing them
DECLINE = "decline"  # "not found", naming the team (strict)
GENERAL = "general"  # the model as a general assistant, with GENERAL_NOTE (open)

GENERAL_NOTE = "（此回答并非来自公司文档。This answer is not from company documents.）"


def route(mode: str, found: bool) -> str:
    """GROUNDED when something relevant was found (passages or the conversation's files), else
    DECLINE (strict) or GENERAL (open)."""
    if found:
        return GROUNDED
    return GENERAL if mode == OPEN else DECLINE


def after_model_decline(mode: str) -> str:
    """The model was shown passages and said they do not answer: DECLINE or GENERAL."""
    return GENERAL if mode == OPEN else DECLINE


def with_general_note(reply: str) -> str:
    """A general answer as the employee gets it: the answer, then the note on a line of its own."""
    return f"{reply.rstrip()}\n\n{GENERAL_NOTE}"


def is_general(reply: str) -> bool:
    return reply.rstrip().endswith(GENERAL_NOTE)
