"""Prices, costs and the token estimates a charge falls back on.

A model's price is versioned: the row with the latest ``valid_from`` not after the call (model
``"*"`` is the fallback), in currency per million tokens (input, cached input, output). Amounts
are ``Decimal`` rounded to millionths (``app.db.Money``).

Charges fail closed: a call is charged the larger of the token counts the model reported and
the estimates here (upper bounds in UTF-8 bytes), so a server that reports no ``usage`` or too
little is not a free model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from sqlalchemy.orm import Session

from app.db import Money, to_money, utcnow
from app.models import ModelPrice
from app.outbox.statements import DriverStatements, read_time

MILLION = Decimal(1_000_000)
FALLBACK_MODEL = "*"
TEMPLATE_TOKENS_PER_MESSAGE = 8  # role token, newline, metadata, separators: GLM's use 2-4
TEMPLATE_TOKENS_PER_PROMPT = 8  # [gMASK]<sop>, the generation prompt, an empty think part
TEMPLATE_TOKENS_FOR_TOOLS = 512  # the bytes of GLM's words around the tools (preamble, call format)


# -- the price table -------------------------------------------------------------------------------
def set_price(session: Session, model: str, input_per_m, cached_input_per_m, output_per_m,
              currency: str = "CNY", valid_from: datetime | None = None) -> ModelPrice:
    price = ModelPrice(model=model, input_per_m=to_money(input_per_m),
                       cached_input_per_m=to_money(cached_input_per_m),
                       output_per_m=to_money(output_per_m), currency=currency,
                       valid_from=valid_from or utcnow())
    session.add(price)
    session.flush()
    return price


def retire_price(session: Session, price_id: int, now: datetime | None = None) -> ModelPrice:
    """Delete a price version that has not taken effect yet.

    A version already in effect has priced calls (``usage_records.price_id``): it stays, and a
    new version with a later ``valid_from`` replaces it from then on.
    """
    price = session.get(ModelPrice, price_id)
    if price is None:
        raise LookupError(f"no price version {price_id}")
    if price.valid_from <= (now or utcnow()):
        raise ValueError("this version is in effect already; add a new version instead")
    session.delete(price)
    session.flush()
    return price


# -- costs -----------------------------------------------------------------------------------------
def cost_of(price: ModelPrice | None, prompt_tokens: int, cached_tokens: int,
            completion_tokens: int) -> Decimal:
    if price is None:
        return Decimal(0)
    cached = min(max(cached_tokens, 0), prompt_tokens)
    total = ((prompt_tokens - cached) * price.input_per_m + cached * price.cached_input_per_m
             + completion_tokens * price.output_per_m)
    return to_money(total / MILLION)


def worst_case(price: ModelPrice | None, prompt_tokens: int, max_new_tokens: int) -> Decimal:
    """The most a call can cost: no cache hit, every allowed token generated."""
    return cost_of(price, prompt_tokens, 0, max_new_tokens)


# -- estimates -------------------------------------------------------------------------------------
def _utf8_len(value) -> int:
    if value is None:
        return 0
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)
    return len(value.encode("utf-8", "surrogatepass"))


def estimate_prompt_tokens(messages: Iterable[dict], tools: Iterable[dict] = ()) -> int:
    """An upper bound on the prompt's tokens without a tokenizer: its UTF-8 bytes.

    Every token of a byte-level BPE tokenizer (GLM's) covers at least one byte of text, and one
    with byte fallback spends at most one token a byte, so no text (emoji, rare CJK outside the
    vocabulary: 4 bytes, up to 4 tokens, for one character) takes more tokens than bytes. The
    role and the template's tokens are added for every message and once for the prompt. The
    tools offered (OpenAI's dicts, as JSON) and the calls in the conversation are prompt too: a
    long list of tools is never a way around a budget.
    """
    tools = list(tools)
    return TEMPLATE_TOKENS_PER_PROMPT + sum(
        _utf8_len(m.get("content")) + _utf8_len(m.get("reasoning_content")) + _utf8_len(m.get("tool_calls"))
        + _utf8_len(m.get("role")) + TEMPLATE_TOKENS_PER_MESSAGE for m in messages) + (
        sum(_utf8_len(t) + TEMPLATE_TOKENS_PER_MESSAGE for t in tools) + TEMPLATE_TOKENS_FOR_TOOLS if tools else 0)


def estimate_choice_tokens(choices: Iterable[str]) -> int:
    """An upper bound on the tokens a request's ``guided_choice`` replies cost the engine: each
    is tokenized and, scored by likelihood, prefilled whole after the prompt with its
    end-of-sequence token (``inference.engine.choice_scoring``); 64 replies of 300 characters
    took 23 times a plain answer's time and were charged as the 7 tokens of the prompt. Counted
    in either scoring mode, as prompt tokens: their UTF-8 bytes and one token each."""
    return sum(_utf8_len(c) + 1 for c in choices)


def estimate_completion_tokens(text: str, reasoning: str = "") -> int:
    """An upper bound on the tokens that wrote ``text`` (and a think part): their UTF-8 bytes,
    and the think tags."""
    return _utf8_len(text) + _utf8_len(reasoning) + (2 if reasoning else 0)


# -- the prices of one batch of the ledger writer ----------------------------------------------------
class PriceVersion(NamedTuple):
    """A ``model_prices`` row (the attributes ``cost_of`` and ``worst_case`` read)."""

    id: int
    model: str
    input_per_m: Decimal
    cached_input_per_m: Decimal
    output_per_m: Decimal
    currency: str
    valid_from: datetime


@functools.cache
def _prices_sql(models: int) -> str:
    return ("SELECT id, model, input_per_m, cached_input_per_m, output_per_m, currency, valid_from "  # noqa: S608
            f"FROM {ModelPrice.__tablename__} WHERE model IN ({', '.join('?' * models)}) "
            "ORDER BY valid_from DESC, id DESC")


_money = Money().process_result_value


class PriceBook:
    """Every price version of a batch's models and of the fallback (``*``), read once; ``at``
    is the price in effect for one call: the model's latest version by then, else the fallback's."""

    def __init__(self, sql: DriverStatements, models: set[str]):
        self.versions: dict[str, list[PriceVersion]] = {}
        if models:
            names = sorted(models | {FALLBACK_MODEL})
            for id_, model, input_m, cached_m, output_m, currency, valid_from in sql.execute(
                    _prices_sql(len(names)), names):
                self.versions.setdefault(model, []).append(PriceVersion(
                    id_, model, _money(input_m, None), _money(cached_m, None),
                    _money(output_m, None), currency, read_time(valid_from)))

    def at(self, model: str, at: datetime) -> PriceVersion | None:
        for name in (model, FALLBACK_MODEL):
            for price in self.versions.get(name, ()):
                if price.valid_from <= at:
                    return price
        return None
