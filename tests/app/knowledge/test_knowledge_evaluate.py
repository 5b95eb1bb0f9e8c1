"""The knowledge-base eval (`python -m demo.eval --questions FILE --json`): its scoring,
and one short run through the real upload, retrieval, prompt and the bundled demo model."""

from __future__ import annotations

import json

import pytest

from app.knowledge.evaluate import Tally, load_questions
from demo import eval as demo_eval

SET = "demo/eval_sets/new_wordings.jsonl"
DEV_SET = "demo/eval_sets/dev.jsonl"  # for choosing settings


def test_scoring_facts_declines_and_citations():
    tally = Tally()
    tally.add({"question": "a", "facts": [["10天", "10 days"], ["HR"]], "section": "3. HR"},
              "第一年 10 days，找 HR", ["手册 › 3. HR 人力资源"], False)
    tally.add({"question": "b", "facts": [["8100"]], "section": "2. IT"}, "打 8200", ["手册 › 7. Office"], False)
    tally.add({"question": "c", "facts": [["1"]]}, "没找到，请联系 IT 服务台（分机 8100）", [], True)  # holds "1", declined
    tally.add({"question": "d", "out_of_scope": True}, "没找到", [], True)
    tally.add({"question": "e", "out_of_scope": True}, "瞎说", [], False)
    assert tally.summary() == {"key_facts": round(1 / 3, 4), "in_scope": 3, "wrongly_declined": round(1 / 3, 4),
                               "declined_out_of_scope": 0.5, "out_of_scope": 2, "cited_section_correct": 0.5}


def test_a_fact_in_markdown_emphasis_counts_as_said():
    tally = Tally()
    item = {"question": "a", "facts": [["5 次"], ["15 分钟"]]}
    tally.add(item, "连续输错 **5** 次后账号锁定 **15 分钟**。", [], False)
    tally.add(item, "输错 5 次，锁定 `15 分钟`", [], False)
    tally.add(item, "连续输错 **6** 次后账号锁定 **15 分钟**。", [], False)
    assert tally.answered_facts == 2


def test_the_shipped_set_is_new_wordings_with_enough_of_each_kind():
    from demo.corpus import load_dialogues, load_qa

    trained = {q for it in load_qa() for q in [it["question"], *it["paraphrases"], *it["heldout"]]}
    trained |= {m["content"] for d in load_dialogues() for m in d["messages"]}
    items, tuning = load_questions(SET), load_questions(DEV_SET)
    assert not [i["question"] for i in items + tuning if i["question"] in trained]
    assert not {i["question"] for i in items} & {i["question"] for i in tuning}
    assert sum(1 for i in items if i.get("facts")) >= 40 and sum(1 for i in items if i.get("out_of_scope")) >= 30
    # the development set chooses the reading: big enough that one retrain's noise does not (255 + 86)
    assert sum(1 for i in tuning if i.get("facts")) >= 250 and sum(1 for i in tuning if i.get("out_of_scope")) >= 80


def test_a_bad_line_is_refused(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question": "no facts"}\n')
    with pytest.raises(ValueError, match="q.jsonl:1"):
        load_questions(bad)


def test_json_mode_prints_each_answer_then_the_summary(tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(q, ensure_ascii=False) for q in [
        {"question": "域账号的密码最少要几个字符？", "facts": [["12"]], "section": "2. IT"},
        {"question": "明天上海会下雨吗？", "out_of_scope": True}]) + "\n")
    demo_eval.main(["--questions", str(questions), "--json"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert [r["question"] for r in rows] == ["域账号的密码最少要几个字符？", "明天上海会下雨吗？"]
    assert set(rows[0]) == {"question", "answer", "citations", "declined"}
    assert rows[1]["declined"] is True and "没有找到" in rows[1]["answer"]
    assert not rows[0]["declined"] and any("2. IT" in c for c in rows[0]["citations"])
    assert summary["summary"]["in_scope"] == 1 and summary["passages_in_prompt"] is True


def test_the_space_between_a_chinese_character_and_a_number_is_not_read():
    """"次月 10 日" says "10日" and "10 日" alike (Chinese typesetting's space); digits stay apart."""
    tally = Tally()
    item = {"question": "a", "facts": [["10日"], ["Xinghe Connect"]]}
    tally.add(item, "次月 10 日发放，客户端 Xinghe Connect", [], False)
    tally.add({"question": "b", "facts": [["10 日"]]}, "次月10日发放", [], False)
    tally.add({"question": "c", "facts": [["10 日"]]}, "次月 1 0 日发放", [], False)
    tally.add({"question": "d", "facts": [["XingheConnect"]]}, "Xinghe Connect", [], False)
    assert tally.answered_facts == 2


def test_held_out_facts_leave_out_words_capitalised_only_as_a_sentence_start():
    common = {"the", "please", "desk", "you"}
    answer = "The IT Service Desk is on ext. 8100. Please use Xinghe Connect. You can also call."
    assert demo_eval.reference_facts(answer, common) == {"Service", "Desk", "8100", "Xinghe",
                                                         "Connect"}
    # a name that opens a sentence stays a fact (capitalised mid-sentence elsewhere, never in lower case)
    names = {"Monday", "Friday", "Xinghe"}
    assert demo_eval.reference_facts("Monday to Friday.", common, names) == {"Monday", "Friday"}
    # a word only ever capitalised as a sentence's first is grammar, even if never written in lower case
    assert demo_eval.reference_facts("Yes. Besides, use Xinghe Connect.", common, names) == {"Xinghe", "Connect"}


def test_held_out_facts_name_an_app_without_its_corner_brackets():
    """The reference's 「打卡」 is the app the handbook calls 企业微信打卡: the name is the fact."""
    assert demo_eval.reference_facts("请在企业微信「打卡」里补卡，每月3次。", set()) == {"打卡", "3"}


def test_a_reranker_decides_relevance_in_the_evaluation_too(tmp_path, capsys):
    from tests.support.rerank_server import FakeRerankServer

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question": "域账号的密码最少要几个字符？", "facts": [["12"]]},
                                    ensure_ascii=False) + "\n")
    server = FakeRerankServer(lambda query, doc: 0.01).start()  # it finds nothing relevant
    try:
        demo_eval.main(["--questions", str(questions), "--json", "--rerank-url", server.url,
                        "--rerank-model", "test-reranker", "--min-relevance", "0.2"])
    finally:
        server.stop()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert server.calls == 1 and server.problems == []
    assert lines[0]["declined"] is True  # answered without it (the test above)
    assert lines[-1]["rerank_base_url"] == server.url and lines[-1]["kb_min_relevance"] == 0.2


def test_questions_asked_in_conversations_keep_a_follow_up_after_its_question():
    from app.knowledge.evaluate import in_conversations

    items = [{"question": f"q{i}", "facts": [["x"]]} for i in range(20)]
    items.append({"question": "那杭州呢？", "follows": "上海的酒店一晚能报多少？", "facts": [["450"]]})
    conversations = in_conversations(items, 8)
    assert conversations == in_conversations(items, 8)  # the same order every run
    asked = [turn for conversation in conversations for turn in conversation]
    scored = [t["question"] for t in asked if not t.get("unscored")]
    assert sorted(scored) == sorted(i["question"] for i in items)  # each once
    assert scored != [i["question"] for i in items]  # shuffled: topics change within one
    assert all(len(c) <= 8 for c in conversations) and len(conversations) == 3
    where = next(c for c in conversations if any(t["question"] == "那杭州呢？" for t in c))
    at = [t["question"] for t in where].index("那杭州呢？")
    assert at > 0 and where[at - 1] == {"question": "上海的酒店一晚能报多少？", "unscored": True}
    assert [len(c) for c in in_conversations(items[-2:], 0)] == [1, 2]  # fresh: with its question only


def test_a_follow_up_must_name_the_question_it_follows(tmp_path):
    bad = tmp_path / "f.jsonl"
    bad.write_text('{"question": "那北京呢？", "follows": "", "facts": [["66"]]}\n')
    with pytest.raises(ValueError, match="f.jsonl:1: follows"):
        load_questions(bad)


def test_conversations_are_reported_beside_the_fresh_questions(tmp_path, capsys):
    """--conversation N: the same questions asked in a row by one employee, as the worker keeps the
    conversation; a follow-up is searched with its question and answered from the right passage."""
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(q, ensure_ascii=False) for q in [
        {"question": "域账号的密码最少要几个字符？", "facts": [["12"]], "section": "2. IT"},
        {"question": "那杭州呢？", "follows": "出差去上海住酒店一晚最多能报多少？", "facts": [["450"]],
         "section": "5. Travel"},
        {"question": "明天上海会下雨吗？", "out_of_scope": True}]) + "\n")
    demo_eval.main(["--questions", str(questions), "--json", "--conversation", "4"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    rows, summary = lines[:-1], lines[-1]
    assert sorted({r["asked"] for r in rows}) == ["conversations of 4", "fresh"]
    for asked in ("fresh", "conversations of 4"):
        mine = {r["question"]: r for r in rows if r["asked"] == asked}
        assert set(mine) == {"域账号的密码最少要几个字符？", "那杭州呢？", "明天上海会下雨吗？"}  # follows: unscored
        assert "450" in mine["那杭州呢？"]["answer"] and not mine["那杭州呢？"]["declined"]
    assert summary["summary"]["in_scope"] == summary["summary (conversations of 4)"]["in_scope"] == 2


def test_documents_replace_the_handbook(tmp_path, capsys):
    """--documents DIR: the knowledge base holds DIR's documents, not the handbook: a handbook
    question finds nothing there, and each row is scored against them."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.md").write_text(
        "# Lanshan notes\n\n## Lockers\n\n- The locker key deposit is RMB 50.\n", encoding="utf-8")
    (tmp_path / "docs" / "ignored.bin").write_bytes(b"\x00\x01")
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps(q, ensure_ascii=False) for q in [
        {"question": "How much is the locker key deposit?", "facts": [["50"]]},
        {"question": "域账号的密码最少要几个字符？", "facts": [["12"]]}]) + "\n")
    assert demo_eval.documents_in(str(tmp_path / "docs")) == [(tmp_path / "docs" / "notes.md", "Lanshan notes")]
    demo_eval.main(["--questions", str(questions), "--json", "--documents", str(tmp_path / "docs")])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    rows, summary = {r["question"]: r for r in lines[:-1]}, lines[-1]
    assert summary["documents"] == str(tmp_path / "docs")
    assert rows["域账号的密码最少要几个字符？"]["declined"]  # the handbook is not there
    assert all("Handbook" not in c for r in rows.values() for c in r["citations"])


def test_documents_must_be_a_directory_with_documents(tmp_path):
    with pytest.raises(SystemExit, match="not a directory"):
        demo_eval.documents_in(str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="no document"):
        demo_eval.documents_in(str(tmp_path))
