"""The think part and the answer of a reply, split as the reply streams in."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.reasoning import STARTS, ReasoningSplitter, split_reasoning

REPLIES = [
    "<think>用户问年假。</think>年假有十天。",  # GLM-4.7 style, tag written by the model
    "\n<think>The user asks about leave.\nCheck the handbook.</think>\n\nTen days.",  # GLM-4.5
    "用户问年假。</think>年假有十天。",  # the prompt pre-filled <think>
    "no think part at all, <think> later is text",
    "<think>cut off by max_tokens, never clo",
    "<think></think>\n答案",  # thinking switched off by the model itself: an empty think part
    "  leading spaces, then an answer",
    "<thinking is not the tag",
    "a stray </think> close",
    "<think>a </thin k> lookalike and a </ then</think>end",
    "",
    "\n\n",
]


def reference(text: str, start: str) -> tuple[str, str]:
    """What a reply is, read whole (an oracle written apart from the streaming code)."""
    def after_close(body):
        reasoning, close, answer = body.partition("</think>")
        return (reasoning, answer.lstrip("\n")) if close else (body, "")

    if start == "thinking":
        return after_close(text)
    if text.lstrip().startswith("<think>"):
        return after_close(text.lstrip()[len("<think>"):])
    if start == "unknown" and "</think>" in text:
        return after_close(text)
    return "", text


def stream(chunks: list[str], start: str) -> tuple[list[tuple[str, str]], ReasoningSplitter]:
    splitter = ReasoningSplitter(start)
    deltas = [splitter.feed(chunk) for chunk in chunks]
    deltas.append(splitter.finish())
    return deltas, splitter


def joined(deltas) -> tuple[str, str]:
    return "".join(r for r, _ in deltas), "".join(a for _, a in deltas)


def cut(text: str, points) -> list[str]:
    points = sorted(set(points))
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("text", REPLIES)
def test_whole_reply(text, start):
    assert split_reasoning(text, start) == reference(text, start)


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("text", REPLIES)
def test_every_cut_and_every_pair_of_cuts(text, start):
    """A delta boundary at every position, so every tag is split at each of its bytes."""
    expected = reference(text, start)
    for points in itertools.chain(
            ((i,) for i in range(len(text) + 1)),
            itertools.combinations(range(1, len(text)), 2)):
        deltas, splitter = stream(cut(text, points), start)
        assert joined(deltas) == expected, points
        assert (splitter.reasoning, splitter.answer) == expected


@pytest.mark.parametrize("start", STARTS)
@pytest.mark.parametrize("text", REPLIES)
def test_one_character_at_a_time(text, start):
    deltas, _ = stream(list(text), start)
    assert joined(deltas) == reference(text, start)


@pytest.mark.parametrize("start, text", [
    ("answer", "\n<think>我想想</think>\n答案"),
    ("thinking", "我想想</think>答案"),
    ("unknown", "我想想</think>答案"),
    ("unknown", "<think>我想想</think>答案"),
])
def test_no_answer_is_released_before_the_think_part_ends(start, text):
    end = text.index("</think>") + len("</think>")
    for points in itertools.combinations(range(1, len(text)), 2):
        splitter, released = ReasoningSplitter(start), 0
        for chunk in cut(text, points):
            _, answer = splitter.feed(chunk)
            released += len(chunk)
            if released < end:
                assert answer == "", (points, chunk)
        splitter.finish()
        assert splitter.answer == "答案"


def test_reasoning_streams_as_it_comes():
    splitter = ReasoningSplitter("answer")
    assert splitter.feed("<think>first ") == ("first ", "")
    assert splitter.feed("second </") == ("second ", "")  # "</" may be the close tag
    assert splitter.feed("b> third") == ("</b> third", "")
    assert splitter.feed("</think>\n\nThe answer") == ("", "The answer")
    assert splitter.feed(" goes on") == ("", " goes on")
    assert splitter.finish() == ("", "")
    assert splitter.thought


def test_an_unterminated_think_part_is_all_reasoning():
    splitter = ReasoningSplitter("thinking")
    assert splitter.feed("still thinking when max_tokens came </thi") == (
        "still thinking when max_tokens came ", "")
    assert splitter.finish() == ("</thi", "")
    assert splitter.answer == "" and splitter.thought


def test_a_reply_without_a_think_part_streams_as_answer_at_once():
    splitter = ReasoningSplitter("answer")
    assert splitter.feed("年假") == ("", "年假")
    assert splitter.feed("有十天") == ("", "有十天")
    assert splitter.finish() == ("", "")
    assert not splitter.thought


def test_unknown_holds_the_reply_until_it_is_known():
    splitter = ReasoningSplitter("unknown")
    assert splitter.feed("maybe reasoning") == ("", "")
    assert splitter.feed(", maybe not") == ("", "")
    assert splitter.finish() == ("", "maybe reasoning, maybe not")
    assert not splitter.thought


def test_assume_answer_releases_what_was_held():
    splitter = ReasoningSplitter("unknown")
    assert splitter.feed("held") == ("", "")
    assert splitter.assume_answer() == "held"
    assert splitter.feed(" then free") == ("", " then free")
    assert splitter.assume_answer() == ""  # already answering
    fresh = ReasoningSplitter("thinking")  # a parsing server's content, pre-filled template
    assert fresh.assume_answer() == "" and fresh.feed("all answer") == ("", "all answer")
    started = ReasoningSplitter("thinking")
    assert started.feed("r") == ("r", "")
    assert started.assume_answer() == "" and started.feed("</think>a") == ("", "a")


def test_misuse_is_refused():
    with pytest.raises(ValueError, match="start"):
        ReasoningSplitter("maybe")
    splitter = ReasoningSplitter()
    splitter.finish()
    with pytest.raises(RuntimeError):
        splitter.feed("late")


REPLY_TEXT = st.lists(
    st.sampled_from(["<think>", "</think>", "<", "</", "<th", "think>", "\n", " ", "想", "a", "b>"]),
    max_size=14).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=REPLY_TEXT, start=st.sampled_from(STARTS), cuts=st.lists(st.integers(0, 60), max_size=8))
def test_any_deltas_add_up_to_the_whole_reply(text, start, cuts):
    deltas, _ = stream(cut(text, [c for c in cuts if c <= len(text)]), start)
    assert joined(deltas) == reference(text, start)
