"""KB_QUOTE_UNIT=sentence: an extractive model quotes one sentence of a passage, so the answer is
the fact asked (the Tier 2 hotel limit), not the five tiers of its section."""

from types import SimpleNamespace

from app.knowledge.prompt import NOT_FOUND_EN, NOT_FOUND_ZH, quote_choices, reply_choices, sentences
from app.knowledge.retrieval import Passage


def passage(n, text):
    return Passage(chunk_id=n, document_id=1, title="Handbook", section="5. Travel", text=text,
                   score=1.0, coverage=0.5)


def test_bullets_lose_their_marker_and_wrapped_lines_are_joined_back():
    text = ("### Hotels\n- **Hotel limits** per night:\n  - Tier 1 (Beijing, Shanghai): **600 RMB**\n"
            "  - Tier 2 (provincial capitals plus\n    Hangzhou): **450 RMB**\n1. Book via Ctrip.")
    assert sentences(text) == ["**Hotel limits** per night:", "Tier 1 (Beijing, Shanghai): **600 RMB**",
                               "Tier 2 (provincial capitals plus Hangzhou): **450 RMB**", "Book via Ctrip."]


def test_a_line_is_cut_after_each_sentence_but_not_after_an_abbreviation():
    assert sentences("- Call ext. **8100**. **Notice**: 30 days. See e.g. HR first. 病假须提交证明。事假无薪。") == [
        "Call ext. **8100**.", "**Notice**: 30 days.", "See e.g. HR first.", "病假须提交证明。", "事假无薪。"]


def test_bullets_a_chunk_ran_together_are_apart_again():
    text = "- Maternity leave: **158 days**. - Paternity leave: **15 days**, within 6 months. - 丧假：**3 天**。"
    assert sentences(text) == ["Maternity leave: **158 days**.", "Paternity leave: **15 days**, within 6 months.",
                               "丧假：**3 天**。"]
    assert sentences("Open 2021-2022 - see HR") == ["Open 2021-2022 - see HR"]  # a dash inside a sentence


def test_table_rows_read_as_first_cell_then_the_others_and_the_header_is_context():
    text = "| Team | Ext. | Hours |\n|---|---|---|\n| IT help desk | **8100** | 08:30-19:00 |\n| 人事部 | 8000 | |"
    assert sentences(text) == ["IT help desk: **8100**; 08:30-19:00", "人事部：8000"]


def test_each_sentence_is_a_choice_with_its_passage_number_and_not_found_stays_one():
    passages = [passage(1, "- Ab. B is 2.\n- Same line."), passage(2, "- Same line.\n| xy |")]
    assert quote_choices(passages, "sentence") == (
        "Ab. [1]", "B is 2. [1]", "Same line. [1]", "Same line. [2]", "xy [2]", NOT_FOUND_ZH, NOT_FOUND_EN)
    assert quote_choices(passages) == ("- Ab. B is 2.\n- Same line. [1]", "- Same line.\n| xy | [2]",
                                       NOT_FOUND_ZH, NOT_FOUND_EN)
    # a passage of nothing but a heading is quoted whole rather than offering nothing
    assert quote_choices([passage(1, "## Travel")], "sentence")[0] == "## Travel [1]"


def test_the_setting_picks_the_unit():
    passages = [passage(1, "- One. Two.")]
    settings = SimpleNamespace(kb_answer_by_quoting=True, kb_passages_in_prompt=True, kb_quote_unit="sentence")
    assert reply_choices(settings, passages)[:2] == ("One. [1]", "Two. [1]")
    settings.kb_quote_unit = "passage"
    assert reply_choices(settings, passages)[0] == "- One. Two. [1]"
    settings.kb_answer_by_quoting = False
    assert reply_choices(settings, passages) == ()
