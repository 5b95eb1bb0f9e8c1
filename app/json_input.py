"""JSON from outside the process (request bodies, decrypted callbacks), its nesting bounded.

``json.loads`` recurses once per level: a body of 20,000 ``[`` (40 KB, under every size limit)
raises ``RecursionError``, which is no ``ValueError`` and escaped every handler as a 500. A
value parsed just under the interpreter's limit would fail the same way later, wherever it is
walked or dumped again (the audit payload, the model request). Nothing this project accepts
nests deeper than a handful of levels, so ``MAX_DEPTH`` is generous and fixed.
"""

from __future__ import annotations

import json

MAX_DEPTH = 64


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than ``MAX_DEPTH``."""


def loads(data: str | bytes, max_depth: int = MAX_DEPTH):
    """``json.loads``, or ``ValueError`` (``JsonTooDeep`` for nesting) for anything not JSON."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise JsonTooDeep(f"JSON nested more than {max_depth} levels") from None
    if depth(value, max_depth) > max_depth:
        raise JsonTooDeep(f"JSON nested more than {max_depth} levels")
    return value


def depth(value, stop: int = MAX_DEPTH) -> int:
    """Nesting depth of a parsed value (a scalar is 0), counted without recursion; counting
    stops just past ``stop``."""
    deepest, level = 0, [(value, 0)]
    while level:
        node, d = level.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        deepest = max(deepest, d + 1)
        if deepest > stop:
            return deepest
        level.extend((child, d + 1) for child in node)
    return deepest
