"""Retrieved passages -> the model's messages, the sources line, and the "not found" reply.

Both model backends take the same chat messages, so grounding is done once, here: the system
message gets the numbered passages and the rule to answer only from them; the question stays the
user's own message (the conversation before it unchanged). The model is asked to mark what it
used with the passages' numbers; the sources line lists those (all given passages when it marked
none), as "title › section", in WeCom markdown for the AI bot's stream and as plain lines for
``message/send`` text. When the model says the passages do not answer (the rules give it the
words), the employee gets the same "not found" reply, naming the team to ask, as when retrieval
found nothing, and no sources.
"""

from __future__ import annotations

import re

from app.knowledge.retrieval import Passage

DEFAULT_CONTACT = "相关负责部门（如 HR 或 IT 服务台） / the team responsible (e.g. HR or the IT help desk)"
GROUNDING_RULES = (
    "请只根据下面编号的资料回答，用到哪条资料就在句末标注它的编号，如 [1]。"
    "资料里没有答案时，回答“{zh}”，并建议联系{contact}，不要猜测。\n"
    "Answer only from the numbered passages below and mark what you use with its number, like [1]. "
    "If they do not answer the question, reply \"{en}\" and suggest contacting {contact}; "
    "never guess."
)
NOT_FOUND_ZH = "抱歉，我在知识库里没有找到这个问题的答案。"
NOT_FOUND_EN = "Sorry, I could not find this in the knowledge base."
# A reply that opens with either sentence is the model's "not found" (the rules ask for them).
DECLINE = re.compile(r"^\s*(抱歉，?我在知识库里没有找到|sorry, i could not find (this|it|that) in the knowledge base)",
                     re.I)
CITATION = re.compile(r"\[(\d{1,2})\]")
SMALL_TALK = re.compile(
    r"^\s*(你好|您好|嗨|哈喽|早上好|上午好|下午好|晚上好|早安|晚安|谢谢|多谢|感谢|谢啦|再见|拜拜|好的|好滴|收到|嗯+|哦+|"
    r"ok|okay|hi|hello|hey|thanks|thank you|thx|bye|goodbye|good (morning|afternoon|evening|night)|"
    r"great|cool)[\s!！。.,，~～]*(小星|xiaoxing|bot)?[\s!！。.,，~～]*$", re.I)


def contact_of(settings) -> str:
    return (settings.kb_fallback_contact or "").strip() or DEFAULT_CONTACT


def not_found_reply(contact: str) -> str:
    return (f"{NOT_FOUND_ZH[:-1]}，请联系{contact}。\n"
            f"{NOT_FOUND_EN} Please ask {contact}.")


def is_decline(reply: str) -> bool:
    """The model said the passages do not answer the question (in the words the rules give)."""
    return bool(DECLINE.match(reply))


def is_small_talk(text: str) -> bool:
    """A greeting or thanks: answered by the model as before, not searched (and never declined)."""
    return bool(SMALL_TALK.match(text))


def system_message(system_prompt: str, passages: list[Passage], contact: str) -> str:
    lines = [system_prompt.strip(), "", GROUNDING_RULES.format(contact=contact, zh=NOT_FOUND_ZH, en=NOT_FOUND_EN), "",
             "资料 / Passages:"]
    for number, passage in enumerate(passages, 1):
        lines += [f"[{number}] {passage.source}", passage.text.strip(), ""]
    return "\n".join(lines).rstrip()


def shown_history(settings, history: list[dict]) -> list[dict]:
    """The conversation a grounded prompt carries. None for a model that answers by quoting a
    passage (KB_ANSWER_BY_QUOTING): its reply is one of this question's passages, which
    retrieval found with the previous question where it was a follow-up, and the earlier
    exchanges only pulled it toward "not found" (the demo model on the development set asked
    in conversations of 8: 60.8 % key facts with them, 73.3 % without, as asked fresh). A model
    that writes its answer keeps the whole conversation (it resolves "it", "that one")."""
    return [] if answers_by_quoting(settings) else history


def grounded_messages(system_prompt: str, history: list[dict], question: str,
                      passages: list[Passage], contact: str) -> list[dict]:
    return [{"role": "system", "content": system_message(system_prompt, passages, contact)},
            *history, {"role": "user", "content": question}]


def quote_reply(passage: Passage, number: int) -> str:
    """An extractive model's answer: the passage as the prompt shows it, with its number."""
    return f"{passage.text.strip()} [{number}]"


def quote_choices(passages: list[Passage], unit: str = "passage") -> tuple[str, ...]:
    """Every reply an extractive model may give over these passages (KB_ANSWER_BY_QUOTING):
    one of them quoted (whole, or one of its sentences: ``unit``), or "not found" in either
    language."""
    if unit == "sentence":
        quotes = [f"{sentence} [{n}]" for n, p in enumerate(passages, 1) for sentence in sentences(p.text)]
        quotes = list(dict.fromkeys(quotes)) or [quote_reply(p, n) for n, p in enumerate(passages, 1)]
    else:
        quotes = [quote_reply(p, n) for n, p in enumerate(passages, 1)]
    return (*quotes, NOT_FOUND_ZH, NOT_FOUND_EN)


_BULLET = re.compile(r"^(?:[-*+•]|\d{1,2}[.)、])\s+")
_TABLE_RULE = re.compile(r"^\|?\s*:?-{2,}")
# after a Chinese full stop, or a Latin one followed by a space and a capital (not "ext. 8100")
_SENTENCE_END = re.compile(r"(?<=[。！？])|(?<![Ee]xt\.)(?<!\b[ei]\.[ge]\.)(?<=[a-z0-9)*][.!?])\s+(?=[A-Z\"“(「\u4e00-\u9fff]|\*\*[A-Z])")
_INLINE_BULLET = re.compile(r"(?<=[.。:：;；)）*!?！？])\s+[-*•]\s+")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def sentences(text: str) -> list[str]:
    """A passage as an extractive model quotes it, sentence by sentence: each line without its
    list marker (a bullet, a table row as "first cell: the others"), cut after each sentence;
    headings, table rules and a table's header row are context, not answers."""
    found: list[str] = []
    lines = logical_lines(text)
    for index, line in enumerate(lines):
        if not line or line.startswith(("#", ">")) or _TABLE_RULE.match(line):
            continue
        if line.startswith("|"):
            if index + 1 < len(lines) and _TABLE_RULE.match(lines[index + 1]):
                continue  # the header row
            line = table_row(line)
        for item in _INLINE_BULLET.split(_BULLET.sub("", line)):  # bullets a chunk ran together
            found += [part.strip() for part in _SENTENCE_END.split(item) if len(part.strip()) > 1]
    return found


def logical_lines(text: str) -> list[str]:
    """The text's lines with Markdown's wrapped lines joined back to the bullet or paragraph they
    continue (a line that opens no bullet, row, heading or quote after a non-blank one)."""
    lines: list[str] = []
    previous_blank = True
    for raw in text.splitlines():
        line = raw.strip()
        opens = not line or previous_blank or line.startswith(("|", "#", ">")) or _BULLET.match(line)
        if opens or not lines or lines[-1].startswith(("|", "#")):
            lines.append(line)
        else:
            joint = "" if _CJK.match(line[:1]) and _CJK.match(lines[-1][-1:]) else " "
            lines[-1] = f"{lines[-1]}{joint}{line}"
        previous_blank = not line
    return lines


def table_row(line: str) -> str:
    """``| Spills | call ext. 6119 |`` -> ``Spills: call ext. 6119`` (Chinese: a full-width colon)."""
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    cells = [cell for cell in cells if cell]
    if len(cells) < 2:
        return cells[0] if cells else ""
    colon = "：" if _CJK.search(cells[0]) and not cells[0].isascii() else ": "
    return f"{cells[0]}{colon}{'; '.join(cells[1:])}"


def answers_by_quoting(settings) -> bool:
    """The model answers by quoting one of its prompt's passages (KB_ANSWER_BY_QUOTING)."""
    return bool(settings.kb_answer_by_quoting and settings.kb_passages_in_prompt)


def reply_choices(settings, passages: list[Passage]) -> tuple[str, ...]:
    """The replies the model is held to under these settings: ``quote_choices`` when it answers
    by quoting the passages of its prompt, else none (it writes freely)."""
    if answers_by_quoting(settings) and passages:
        return quote_choices(passages, getattr(settings, "kb_quote_unit", "passage"))
    return ()


def choice_bias(settings, choices: tuple[str, ...]) -> tuple[float, ...]:
    """KB_DECLINE_BIAS on the "not found" replies among ``choices`` (likelihood scoring only)."""
    if not choices or settings.kb_choice_scoring != "likelihood" or not settings.kb_decline_bias:
        return ()
    return tuple(settings.kb_decline_bias if c in (NOT_FOUND_ZH, NOT_FOUND_EN) else 0.0 for c in choices)


def cited_numbers(reply: str, count: int) -> list[int]:
    """The passage numbers the reply marked, in order of first use; all when it marked none."""
    used = []
    for match in CITATION.finditer(reply):
        number = int(match.group(1))
        if 1 <= number <= count and number not in used:
            used.append(number)
    return used or list(range(1, count + 1))


def with_sources(reply: str, passages: list[Passage], markdown: bool = False) -> str:
    """The reply followed by its sources (document title › section), one line each."""
    if not passages:
        return reply
    seen, lines = set(), []
    for number in cited_numbers(reply, len(passages)):
        source = passages[number - 1].source
        if source in seen:
            continue
        seen.add(source)
        lines.append(f"> [{number}] {source}" if markdown else f"[{number}] {source}")
    head = "**来源 / Sources**" if markdown else "来源 / Sources:"
    return f"{reply.rstrip()}\n\n{head}\n" + "\n".join(lines)
