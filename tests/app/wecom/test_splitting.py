"""split_for_wecom: byte limits, preferred boundaries, nothing but whitespace lost."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.wecom.splitting import MARKDOWN_LIMIT, TEXT_LIMIT, split_for_wecom


def squash(text: str) -> str:
    return "".join(text.split())


def test_limits():
    assert (TEXT_LIMIT, MARKDOWN_LIMIT) == (2048, 4096)


@pytest.mark.parametrize("text", ["", " ", "\n\n\t  \u3000\n"])
def test_blank_input_gives_no_chunks(text):
    assert split_for_wecom(text, TEXT_LIMIT) == []


def test_short_text_is_one_chunk_without_surrounding_blank_lines():
    assert split_for_wecom("\n\n  hello\n  world  \n\n", TEXT_LIMIT) == ["  hello\n  world"]


def test_exact_fit_is_not_split():
    text = "字" * (TEXT_LIMIT // 3) + "ab"  # 2046 + 2 bytes
    assert len(text.encode()) == TEXT_LIMIT
    assert split_for_wecom(text, TEXT_LIMIT) == [text]


def test_prefers_paragraphs():
    first, second = "a" * 1200, "b" * 1200
    line_noise = first[:600] + "\n" + first[601:]
    assert split_for_wecom(f"{line_noise}\n\n{second}", TEXT_LIMIT) == [line_noise, second]


def test_paragraphs_are_packed_together():
    paragraphs = [f"p{i} " + "x" * 300 for i in range(10)]
    chunks = split_for_wecom("\n\n".join(paragraphs), TEXT_LIMIT)
    assert len(chunks) == 2
    assert chunks[0].split("\n\n") == paragraphs[:6]


def test_line_breaks_before_sentences():
    text = "第一行。" + "很" * 400 + "\n" + "第二行。" + "好" * 400
    chunks = split_for_wecom(text, TEXT_LIMIT)
    assert chunks == ["第一行。" + "很" * 400, "第二行。" + "好" * 400]


def test_chinese_sentence_ends():
    sentence = "这是一个句子" * 30 + "。"  # 541 bytes
    chunks = split_for_wecom(sentence * 5, TEXT_LIMIT)
    assert chunks == [sentence * 3, sentence * 2]


def test_ascii_sentence_end_needs_a_following_space():
    text = ("v1.2.3 is out! " * 80).strip()
    chunks = split_for_wecom(text, 200)
    assert all(chunk.endswith("out!") for chunk in chunks)


def test_spaces_before_hard_cuts():
    words = " ".join(["word"] * 1000)
    chunks = split_for_wecom(words, 100)
    assert all(set(chunk.split(" ")) == {"word"} for chunk in chunks)


def test_hard_cut_never_splits_a_character():
    text = "汉" * 1000
    chunks = split_for_wecom(text, 100)
    assert all(len(chunk.encode()) == 99 for chunk in chunks[:-1])
    assert "".join(chunks) == text


def test_hard_cut_keeps_zwj_emoji_whole():
    family = "\U0001F469\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466"  # 25 bytes
    chunks = split_for_wecom("x" + family * 10, 60)
    assert "".join(chunks) == "x" + family * 10
    for chunk in chunks:
        assert chunk.replace(family, "") in ("", "x")


def test_hard_cut_keeps_combining_marks():
    text = "e\u0301" * 100  # é as e + combining acute, 3 bytes each
    chunks = split_for_wecom(text, 10)
    assert all(chunk.startswith("e") and chunk.endswith("\u0301") for chunk in chunks)


def test_one_giant_grapheme_still_splits_safely():
    text = "a" + "\u0301" * 100
    chunks = split_for_wecom(text, 10)
    assert "".join(chunks) == text
    assert all(len(c.encode()) <= 10 for c in chunks)


def test_limit_too_small():
    with pytest.raises(ValueError):
        split_for_wecom("abc", 3)


pieces = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from(["\n", "\n\n", "\r\n", " ", "。", "！", ". ", "; ", "\u3000", "\t",
                     "\U0001F469\u200d\U0001F467", "e\u0301", "\U0001F44D\U0001F3FD", "字" * 50]),
)
texts = st.lists(pieces, max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=texts, limit=st.integers(min_value=4, max_value=300))
def test_chunks_fit_keep_order_and_lose_only_whitespace(text, limit):
    chunks = split_for_wecom(text, limit)
    assert all(len(chunk.encode("utf-8")) <= limit for chunk in chunks)
    assert all(chunk.strip() and chunk == chunk.rstrip() for chunk in chunks)
    assert squash("".join(chunks)) == squash(text)
    if not text.strip():
        assert chunks == []


@settings(max_examples=100, deadline=None)
@given(text=texts)
def test_text_that_fits_is_kept_as_one_chunk(text):
    if text.strip() and len(text.encode()) <= TEXT_LIMIT:
        assert split_for_wecom(text, TEXT_LIMIT) == [text.strip("\r\n").rstrip()]


# -- markdown: a cut never breaks a markup span ----------------------------------------------------
words = st.sampled_from(["年假", "报销", "hotel", "600", "RMB", "每晚", "。", "，", " ", "\n", "\n\n", "字" * 30])
spans = st.one_of(
    st.lists(words, min_size=1, max_size=6).map(lambda w: "**粗" + "".join(w).replace("\n", " ").strip() + "体**"),
    st.lists(words, min_size=1, max_size=4).map(lambda w: "`" + "".join(w).replace("\n", " ").strip() + "x`"),
    st.sampled_from(["[差旅制度 travel](https://example.com/travel)", '<font color="warning">重要 notice</font>']),
)
marked = st.lists(st.one_of(words, spans), max_size=80).map(" ".join)


def spans_of(text):
    from app.wecom.splitting import _markup_spans  # the splitter's own reading of the text

    return [text[s:e] for s, e, _, _ in _markup_spans(text)]


@settings(max_examples=300, deadline=None)
@given(text=marked, limit=st.integers(min_value=200, max_value=600))
def test_markdown_chunks_keep_every_span_whole(text, limit):
    chunks = split_for_wecom(text, limit, markup=True)
    assert all(len(chunk.encode("utf-8")) <= limit for chunk in chunks)
    found = spans_of(text)
    whole = [s for s in found if len(s.encode()) <= limit - 16]
    if len(whole) == len(found):  # no span longer than a chunk: nothing added, nothing lost
        assert squash("".join(chunks)) == squash(text)
    for span in whole:  # each span is in one chunk, never across two
        assert sum(span in chunk for chunk in chunks) >= 1, (span, chunks)
    for chunk in chunks:
        assert chunk.count("**") % 2 == 0 and chunk.count("`") % 2 == 0, chunk


def test_a_span_longer_than_a_chunk_is_closed_and_opened_again():
    text = "**" + "加粗 " * 60 + "完**"
    chunks = split_for_wecom(text, 100, markup=True)
    assert len(chunks) > 2
    assert all(c.startswith("**") and c.endswith("**") and c.count("**") == 2 for c in chunks)
    assert all(len(c.encode()) <= 100 for c in chunks)
    # without markup the same text is cut anywhere (the old behaviour, for text messages)
    assert not all(c.endswith("**") for c in split_for_wecom(text, 100))
