"""Checks on the demo-model training corpus (demo/corpus)."""

import json
import re
from collections import Counter

import pytest

from demo import corpus

CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
REQUIRED = {"id", "topic", "lang", "question", "answer", "paraphrases", "heldout"}


def norm(s: str) -> str:
    return re.sub(r"[\s\W_]+", "", s.lower())


@pytest.fixture(scope="module")
def qa():
    return corpus.load_qa()


def test_every_line_is_valid_json():
    for path in (corpus.QA_PATH, corpus.DIALOGUES_PATH):
        lines = path.read_text(encoding="utf-8").splitlines()
        assert lines, path
        for i, line in enumerate(lines, 1):
            assert line.strip(), f"{path.name}:{i} blank line"
            assert isinstance(json.loads(line), dict), f"{path.name}:{i}"


def test_required_fields_and_types(qa):
    for item in qa:
        assert set(item) == REQUIRED, item.get("id")
        for key in ("id", "topic", "lang", "question", "answer"):
            assert isinstance(item[key], str) and item[key].strip(), (item["id"], key)
        for key in ("paraphrases", "heldout"):
            assert isinstance(item[key], list), (item["id"], key)
            assert all(isinstance(s, str) and s.strip() for s in item[key]), item["id"]
        assert item["topic"] in corpus.TOPICS, item["id"]
        assert item["lang"] in corpus.LANGS, item["id"]
        assert re.fullmatch(r"[a-z]+-[a-z0-9]+-\d{3}", item["id"]), item["id"]
        assert item["id"].startswith(item["topic"] + "-"), item["id"]


def test_ids_unique(qa):
    dupes = [k for k, n in Counter(i["id"] for i in qa).items() if n > 1]
    assert not dupes
    dlg = [d["id"] for d in corpus.load_dialogues()]
    assert len(dlg) == len(set(dlg))
    assert not set(dlg) & {i["id"] for i in qa}


def test_counts(qa):
    assert len(qa) >= 320
    langs = Counter(i["lang"] for i in qa)
    for lang in corpus.LANGS:
        assert langs[lang] / len(qa) >= 0.40, langs
    topics = Counter(i["topic"] for i in qa)
    assert set(topics) == set(corpus.TOPICS), topics
    for topic in corpus.TOPICS:
        for lang in corpus.LANGS:
            assert any(i["topic"] == topic and i["lang"] == lang for i in qa), (topic, lang)


def test_paraphrase_and_heldout_counts(qa):
    for item in qa:
        assert 2 <= len(item["paraphrases"]) <= 4, item["id"]
        assert 1 <= len(item["heldout"]) <= 2, item["id"]


def test_questions_distinct_within_item(qa):
    for item in qa:
        qs = [item["question"], *item["paraphrases"], *item["heldout"]]
        assert len({norm(q) for q in qs}) == len(qs), item["id"]


def test_heldout_never_a_training_question(qa):
    train = {norm(q) for q, _ in corpus.training_pairs()}
    for item in qa:
        for h in item["heldout"]:
            assert norm(h) not in train, (item["id"], h)


def test_training_questions_map_to_one_answer():
    answers = {}
    for q, a in corpus.training_pairs():
        answers.setdefault(norm(q), set()).add(a)
    clashes = {q: a for q, a in answers.items() if len(a) > 1}
    assert not clashes


def test_script_matches_language(qa):
    for item in qa:
        texts = [item["question"], *item["paraphrases"], *item["heldout"]]
        if item["lang"] == "zh":
            assert CJK.search(item["answer"]), item["id"]
            assert all(CJK.search(t) for t in texts), item["id"]
        else:
            ans = item["answer"]
            ascii_share = sum(c.isascii() for c in ans) / len(ans)
            assert ascii_share >= 0.9, (item["id"], ascii_share)
            assert all(t.isascii() for t in texts), item["id"]


def test_answer_length_bounds(qa):
    for item in qa:
        a = item["answer"]
        if item["lang"] == "zh":
            assert 4 <= len(a) <= 100, (item["id"], len(a))
        else:
            words = len(a.split())
            assert 3 <= words <= 50, (item["id"], words)


def test_loader_pairs(qa):
    train = corpus.training_pairs()
    held = corpus.heldout_pairs()
    assert len(train) == sum(1 + len(i["paraphrases"]) for i in qa)
    assert len(held) == sum(len(i["heldout"]) for i in qa)
    assert all(isinstance(q, str) and isinstance(a, str) for q, a in train + held)


def test_dialogues_shape():
    dialogues = corpus.load_dialogues()
    assert len(dialogues) >= 30
    for d in dialogues:
        msgs = d["messages"]
        assert len(msgs) >= 4 and len(msgs) % 2 == 0, d["id"]
        for n, m in enumerate(msgs):
            assert m["role"] == ("user" if n % 2 == 0 else "assistant"), d["id"]
            assert m["content"].strip(), d["id"]


def test_key_facts_match_handbook(qa):
    """Spot-check that the numbers answers rely on are stated in company.md."""
    handbook = corpus.COMPANY_PATH.read_text(encoding="utf-8")
    for fact in ("8100", "8199", "8000", "8200", "8300", "8350", "8500", "Xinghe-Staff",
                 "Xinghe-Guest", "Xinghe Connect", "vpn.xinghe.example", "91310115XH0000888A",
                 "**600 RMB**", "**450 RMB**", "**350 RMB**", "**1,500 RMB**", "**158 days**",
                 "**200 messages**", "`/reset`", "`/usage`", "`/help`"):
        assert fact in handbook, fact
    known_ext = {"8000", "8100", "8199", "8200", "8300", "8350", "8500", "8888"}
    for item in qa:
        for ext in re.findall(r"(?<![\d,.])8\d{3}(?![\d,])", item["answer"]):
            assert ext in known_ext, (item["id"], ext)


def test_unanswerable_questions():
    rows = corpus.load_unanswerable()
    assert len(rows) >= 100
    for row in rows:
        assert isinstance(row.get("question"), str) and row["question"].strip(), row
        assert row.get("lang") in corpus.LANGS, row
        assert isinstance(row.get("near"), str) and row["near"].strip(), row
    keys = [norm(r["question"]) for r in rows]
    dupes = [k for k, n in Counter(keys).items() if n > 1]
    assert not dupes, dupes
    training = {norm(q) for q, _ in corpus.training_pairs()}
    clash = [r["question"] for r in rows if norm(r["question"]) in training]
    assert not clash, clash


def _handbook_body(text: str) -> str:
    """The handbook minus its `#` title and the `>` note (the editions word those differently)."""
    return "\n".join(line for line in text.splitlines()[1:] if not line.startswith((">", "# ")))


def _ascii_names(text: str) -> set[str]:
    """Names that must stay verbatim: `code` spans, plus ASCII names in **bold** (no numbers)."""
    names = set(re.findall(r"`([^`\n]+)`", text))
    for span in re.findall(r"\*\*([^*\n]+)\*\*", text):
        if not span.isascii() or re.search(r"\d", span):
            continue  # numbers are checked on their own; translated labels are not names
        words = span.split()
        if len(words) > 1 and all(w[0].isupper() for w in words):
            names.add(span)  # Xinghe Connect
        # VPN, USB, AI, Wi-Fi (not per-diem)
        names.update(w for w in words if re.fullmatch(r"[A-Z]{2,}|[A-Z][A-Za-z]*-[A-Za-z]+", w))
    return names


def test_chinese_handbook_matches_english():
    """company.zh.md: same ##/### headings, same numbers and names as company.md."""
    assert corpus.HANDBOOKS[0][0] == corpus.COMPANY_PATH
    assert corpus.HANDBOOKS[1][0] == corpus.COMPANY_ZH_PATH
    en = corpus.COMPANY_PATH.read_text(encoding="utf-8")
    zh = corpus.COMPANY_ZH_PATH.read_text(encoding="utf-8")
    assert zh.splitlines()[0] == "# 星河科技员工手册（中文版）"
    assert CJK.search(_handbook_body(zh))

    def headings(text):
        return [line for line in text.splitlines() if re.match(r"#{2,3} ", line)]

    assert headings(zh) == headings(en)

    # Every number of company.md, at least as often as there ("5,000" counts as 5 and 000);
    # the Chinese writes city tiers as 一线/二线城市 where the English has Tier 1/Tier 2.
    en_nums = Counter(re.findall(r"\d+(?:\.\d+)?", _handbook_body(en)))
    zh_nums = Counter(re.findall(r"\d+(?:\.\d+)?", _handbook_body(zh)))
    zh_nums.update({"1": zh.count("一线城市"), "2": zh.count("二线城市")})
    missing = {n: (k, zh_nums[n]) for n, k in en_nums.items() if zh_nums[n] < k}
    assert not missing, f"numbers in company.md missing from company.zh.md (en, zh): {missing}"

    names = _ascii_names(_handbook_body(en))
    assert {"Xinghe-Staff", "vpn.xinghe.example", "Xinghe Connect", "/usage"} <= names
    assert not {n for n in names if n not in zh}, names


def _pairs_and_words(text: str) -> set[str]:
    """A question's Chinese character pairs and Latin words (for near-twin checks)."""
    chars = CJK.findall(text)
    return {a + b for a, b in zip(chars, chars[1:])} | set(re.findall(r"[a-z0-9]+", text.lower()))


def test_embedder_questions_are_new_wordings_or_unanswerable(qa):
    """embedder_questions.jsonl: each row another wording of a handbook item (``answers``: its
    id) or a question the handbook does not answer (``near``), in its language's script, none a
    question of qa.jsonl, unanswerable.jsonl or another row."""
    rows = corpus.load_embedder_questions()
    by_id = {item["id"]: item for item in qa}
    sections = {"none"} | {line[3:] for line in corpus.COMPANY_PATH.read_text(encoding="utf-8").splitlines()
                           if line.startswith("## ")}
    assert sum("answers" in r for r in rows) >= 1000 and sum("near" in r for r in rows) >= 100
    for row in rows:
        assert isinstance(row.get("question"), str) and row["question"].strip(), row
        assert ("answers" in row) != ("near" in row), row
        if "answers" in row:
            item = by_id.get(row["answers"])
            assert item is not None and item["topic"] not in ("greeting", "smalltalk"), row
            assert row["lang"] == item["lang"], row
        else:
            assert row["near"] in sections, row
        assert bool(CJK.search(row["question"])) == (row["lang"] == "zh"), row
    known = {norm(q) for item in qa for q in [item["question"], *item["paraphrases"], *item["heldout"]]}
    known |= {norm(r["question"]) for r in corpus.load_unanswerable()}
    keys = [norm(r["question"]) for r in rows]
    assert len(set(keys)) == len(keys) and not set(keys) & known


def test_embedder_questions_are_no_near_twin_of_an_evaluation_question(qa):
    """Nothing the embedder trains on is a light edit of a held-out paraphrase or a question of
    the evaluation sets: at most half of either's character pairs and words in common."""
    from demo import eval_sets

    evaluation = [h for item in qa for h in item["heldout"]] + sorted(eval_sets.questions())
    marks = [(q, _pairs_and_words(q)) for q in evaluation]
    for row in corpus.load_embedder_questions():
        mine = _pairs_and_words(row["question"])
        for question, theirs in marks:
            shared = len(mine & theirs) / max(1, len(mine | theirs))
            assert shared < 0.5, (row["question"], question, round(shared, 2))
