"""Terms of a text for BM25, and the keyed hashes the index stores instead of them.

Chinese is segmented with jieba's search mode (a long word also yields its shorter words, so
"年假天数" matches "年假"); Latin letters and digits are lower-cased words. A light stopword
list drops the particles and question words that appear in nearly every question ("的", "吗",
"怎么", "the", "how") and would only add noise to the scores.

A term is never stored: the index keeps ``HMAC-SHA256(key, "kb-term\\0" + term)`` truncated to a
signed 64-bit integer (a collision among a vocabulary of a million terms has odds of about
1e-7, and it could only merge two terms' postings, never expose one). Without the key, the
hashes cannot be tested against a dictionary of words.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import threading
from collections import Counter

# Part of every document's content hash: a change to how terms are made re-indexes a document on
# its next upload (``make run``'s handbook); ``kb reindex`` does every document at once.
INDEX_VERSION = "5"
_JIEBA_LOCK = threading.Lock()
_jieba = None

WORD = re.compile(r"[a-z0-9]+(?:[._\-'][a-z0-9]+)*")
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# A token for sizes: one CJK character or one Latin/number word (close to what a BPE tokenizer
# of a Chinese model gives for Chinese, a little under for English).
SIZE_TOKEN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[A-Za-z0-9]+|[^\sA-Za-z0-9]")

STOPWORDS_TEXT = """
的 了 是 吗 呢 吧 啊 呀 嘛 么 和 与 及 或 在 有 我 你 您 他 她 它 我们 你们 他们 这 那 这个 那个 哪 哪个
什么 怎么 怎么办 怎样 如何 为什么 请问 请 一下 一个 可以 能 能不能 可不可以 会 要 需要 想 就 都 也 还 又
把 被 让 给 对 从 到 吗 多少 几 么 个 上 下 中 之 以 其 而 并 等 及其 如果 是否 是不是 没有 不 没
a an the of to in on at for and or is are was were be been am do does did how what when where
which who whom why can could would should shall will may might must i you he she we they me my your
our their its him her them this that these those there here with by from as about please tell any some
s t m d ll ve re have has had get got getting want wants need needs know look going go much many
just also still really ok hi hello thanks if than then so but not no yes up out into over
帮 帮我 我查 查下 还有 去 用 来 人 想 我想 有没有 跟 一样 只有 直接 找 谁 问 告诉 知道 一般 现在 应该
大概 哪里 哪儿 哪些 多久 多长 几个 啥 咋 咋办 怎么弄 为啥 呀 哦 嗯 吧 得 地 着 过 再 才 该 最 很
"""
STOPWORDS = frozenset(STOPWORDS_TEXT.split())
# A question word with its measure ("几次", "几点", "多长时间", "哪天", "多少钱", "什么时候"): removed before
# segmenting, so neither it nor the pieces jieba's search mode cuts from it ("时间" of
# "多长时间") count as something the passage must hold; the number asked for is the answer.
INTERROGATIVE = re.compile(
    r"(?:几|多少|多长|多久|多大|多远|哪)(?:个|次|点|天|号|日|分钟|分|小时|时间|年|月|周|晚|位|种|条|趟|岁|钱|块|元|里)?"
    r"|什么时候|啥时候|何时")
MODALS = frozenset("能可会要想该得")


def _segmenter():
    global _jieba
    if _jieba is None:
        with _JIEBA_LOCK:
            if _jieba is None:
                import jieba

                jieba.setLogLevel(logging.WARNING)
                jieba.initialize()
                _jieba = jieba
    return _jieba


CJK_RUN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def _stem(word: str) -> str:
    """A light English stemmer, the same on both sides: plurals, -ed, -ing and a final -e folded
    ("days" -> "day", "policies" -> "policy", "changed"/"changing"/"change" -> "chang")."""
    if not word.isalpha() or len(word) <= 3:
        return word
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    if len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]  # "stopped" -> "stopp" -> "stop"
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def terms(text: str) -> list[str]:
    """The text's search terms in order, repeats kept (term frequencies count them).

    Besides jieba's words, every run of Chinese characters also gives its character bigrams
    (marked with a leading "~"): jieba cuts the same words differently in different contexts
    ("年假" alone, but "年/假" inside "休几天假"), and bigrams still match then.
    """
    lowered = INTERROGATIVE.sub(" ", text.lower())
    out: list[str] = []
    for piece in _segmenter().cut_for_search(lowered):
        piece = piece.strip()
        if not piece:
            continue
        if CJK.search(piece):
            if len(piece) == 2 and piece[0] in MODALS and CJK.match(piece[1]):
                piece = piece[1]  # "能休" (can take) -> "休": the modal is not the question
            if piece not in STOPWORDS:
                out.append(piece)
            continue
        for word in WORD.findall(piece):
            if word not in STOPWORDS:
                out.append(_stem(word))
    for run in CJK_RUN.findall(lowered):
        out.extend("~" + run[i:i + 2] for i in range(len(run) - 1))
    return out


def term_counts(text: str) -> Counter:
    return Counter(terms(text))


def count_tokens(text: str) -> int:
    """The size of a text in tokens, as chunk sizes are measured."""
    return len(SIZE_TOKEN.findall(text))


class TermHasher:
    """``term -> signed 64-bit int``, keyed: what the postings table stores."""

    def __init__(self, key: bytes | str):
        self._key = key.encode() if isinstance(key, str) else key
        self._cache: dict[str, int] = {}

    def __call__(self, term: str) -> int:
        value = self._cache.get(term)
        if value is None:
            digest = hmac.new(self._key, b"kb-term\x00" + term.encode(), hashlib.sha256).digest()
            value = int.from_bytes(digest[:8], "big", signed=True)
            if len(self._cache) < 500_000:
                self._cache[term] = value
        return value
