"""The grounded prompt's layout and the sources line (plain for message/send, markdown for the AI
bot's stream)."""

from app.knowledge.prompt import (
    NOT_FOUND_EN,
    NOT_FOUND_ZH,
    cited_numbers,
    grounded_messages,
    is_decline,
    is_small_talk,
    not_found_reply,
    with_sources,
)
from app.knowledge.retrieval import Passage


def passage(n, section):
    return Passage(chunk_id=n, document_id=1, title="员工手册", section=section, text=f"text {n}",
                   score=1.0, coverage=0.5)


PASSAGES = [passage(1, "年假"), passage(2, "报销"), passage(3, "年假")]


def test_passages_are_numbered_in_the_system_message_and_the_question_stays_the_users():
    history = [{"role": "user", "content": "早"}, {"role": "assistant", "content": "早上好"}]
    messages = grounded_messages("你是助手。", history, "年假几天？", PASSAGES, "HR")
    system = messages[0]["content"]
    assert system.startswith("你是助手。") and "联系HR" in system and "contacting HR" in system
    assert "[1] 员工手册 › 年假\ntext 1" in system and "[3] 员工手册 › 年假\ntext 3" in system
    assert messages[1:] == [*history, {"role": "user", "content": "年假几天？"}]


def test_sources_list_the_marked_passages_once_each():
    assert cited_numbers("见 [2]，另见 [1] 和 [2]、[9]", 3) == [2, 1]
    assert cited_numbers("没有标注", 3) == [1, 2, 3]
    assert with_sources("答 [3][1]", PASSAGES) == "答 [3][1]\n\n来源 / Sources:\n[3] 员工手册 › 年假"
    assert with_sources("答", PASSAGES, markdown=True) == (
        "答\n\n**来源 / Sources**\n> [1] 员工手册 › 年假\n> [2] 员工手册 › 报销")
    assert with_sources("答", []) == "答"


def test_not_found_names_the_team_and_small_talk_is_recognized():
    assert "IT 服务台" in not_found_reply("IT 服务台") and "could not find" in not_found_reply("x")
    assert all(map(is_small_talk, ["你好", "谢谢！", "Thanks!", "good morning", "早上好小星"]))
    assert not any(map(is_small_talk, ["你好，年假几天", "hello, where is the VPN client?"]))


def test_the_rules_give_the_not_found_words_and_only_those_count_as_a_decline():
    system = grounded_messages("你是助手。", [], "问", PASSAGES, "HR")[0]["content"]
    assert NOT_FOUND_ZH in system and NOT_FOUND_EN in system
    assert is_decline(NOT_FOUND_ZH) and is_decline("  sorry, I could not find it in the knowledge base")
    assert is_decline(not_found_reply("HR"))
    assert not is_decline("年假 10 天 [1]。抱歉，我在知识库里没有找到别的。")  # only as the opening
    assert not is_decline("Sorry, I could not find the VPN client? It is Xinghe Connect [1].")
