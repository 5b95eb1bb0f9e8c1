"""Knowledge base uploads: type by content, each parser, bad uploads refused clearly; chunking
along headings and paragraphs with sizes in tokens; terms of Chinese and English text."""

from __future__ import annotations

import io
import zipfile

import pytest

from app.knowledge import parsing
from app.knowledge.chunking import chunk_blocks
from app.knowledge.parsing import Block, UploadError, detect, parse
from app.knowledge.terms import TermHasher, count_tokens, terms
from emulator.media import pdf_document

HANDBOOK = """# Handbook

## 3. HR 人力资源

- **Annual leave 年假**: 10 days in the first year.
- **Sick leave 病假**: 5 days fully paid.

### Payroll

Salary is paid on the 10th of the following month.

## 2. IT

| Team | Ext |
|---|---|
| IT help desk | 8100 |
"""


def pdf_bytes(lines: list[str]) -> bytes:
    """A small valid PDF with one page of text: the emulator's sample maker (its media/get)."""
    return pdf_document(lines)


def docx_bytes() -> bytes:
    import docx

    document = docx.Document()
    document.add_heading("Travel policy", level=1)
    document.add_paragraph("Hotels in Beijing: up to 600 RMB per night.")
    document.add_heading("Meals", level=2)
    document.add_paragraph("Meal allowance 100 RMB per day.")
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "Taxi", "reimbursed after 22:00"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# -- detection and parsers -------------------------------------------------------------------------
def test_markdown_headings_list_items_and_tables():
    parsed = parse(HANDBOOK.encode(), "handbook.md")
    assert parsed.doc_type == "markdown"
    assert Block("3. HR 人力资源", 2) in parsed.blocks and Block("Payroll", 3) in parsed.blocks
    items = [b.text for b in parsed.blocks if b.level == 0]
    assert items[0].startswith("- **Annual leave") and items[1].startswith("- **Sick leave")
    assert items[-1].startswith("| Team") and "8100" in items[-1]


def test_type_is_found_by_content_not_by_name():
    assert detect(HANDBOOK.encode(), "notes.txt") == "text"  # a text name keeps text kinds apart
    assert detect(HANDBOOK.encode(), None) == "markdown"
    assert detect(b"<!DOCTYPE html><html><body><p>x</p></body></html>", "page.txt") == "html"
    assert detect(pdf_bytes(["hello"]), "scan.PDF") == "pdf"
    assert detect(docx_bytes(), "policy.docx") == "docx"
    assert detect(docx_bytes(), None) == "docx"


@pytest.mark.parametrize("data, name, message", [
    (b"\x89PNG\r\n\x1a\n" + b"\x00" * 100, "report.pdf", "PNG image"),
    (b"plain words only", "report.pdf", "named like PDF but its content is TEXT"),
    (b"%PDF-1.4\n" + b"garbage" * 50, "report.txt", "named like TEXT but its content is PDF"),
    (b"", "empty.md", "empty"),
    (b"\x00\x01\x02binary\x00" * 100, "x.md", "binary"),
    (b"PK\x03\x04 not really a zip", "a.docx", "damaged"),
])
def test_wrong_or_unsupported_types_are_refused_clearly(data, name, message):
    with pytest.raises(UploadError, match=message):
        parse(data, name)


def test_a_zip_that_is_not_a_word_document_is_refused():
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("data.csv", "a,b\n")
    with pytest.raises(UploadError, match="not a Word document"):
        parse(out.getvalue(), "a.docx")


def test_size_limit():
    with pytest.raises(UploadError, match="limit is"):
        parse(b"x" * 2048, "big.txt", max_bytes=1024)


def test_html_keeps_headings_drops_scripts():
    html = ("<html><head><title>t</title><style>p{}</style></head><body><h1>Guide</h1>"
            "<script>alert('SECRET')</script><p>First&nbsp;para.</p><h2>Wi-Fi</h2>"
            "<ul><li>Xinghe-Staff for staff</li><li>Xinghe-Guest</li></ul></body></html>")
    parsed = parse(html.encode(), "guide.html")
    assert parsed.blocks[0] == Block("Guide", 1) and Block("Wi-Fi", 2) in parsed.blocks
    assert "SECRET" not in parsed.text and Block("Xinghe-Staff for staff") in parsed.blocks


def test_pdf_text_by_page():
    parsed = parse(pdf_bytes(["Expense claims within 30 days.", "Ask finance ext 8300."]), "x.pdf")
    assert parsed.doc_type == "pdf" and parsed.blocks[0] == Block("p. 1", 1)
    assert "30 days" in parsed.text and "8300" in parsed.text


def test_encrypted_broken_and_textless_pdfs_are_refused():
    from pypdf import PdfWriter

    writer = PdfWriter()
    writer.add_blank_page(612, 792)
    writer.encrypt("secret-password")
    out = io.BytesIO()
    writer.write(out)
    with pytest.raises(UploadError, match="encrypted"):
        parse(out.getvalue(), "locked.pdf")
    with pytest.raises(UploadError, match="damaged"):
        parse(b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 9 0 R", "broken.pdf")
    blank = PdfWriter()
    blank.add_blank_page(612, 792)
    out = io.BytesIO()
    blank.write(out)
    with pytest.raises(UploadError, match="no text"):
        parse(out.getvalue(), "scan.pdf")


def test_docx_headings_paragraphs_and_tables():
    parsed = parse(docx_bytes(), "policy.docx")
    assert parsed.blocks[0] == Block("Travel policy", 1) and Block("Meals", 2) in parsed.blocks
    assert Block("Taxi | reimbursed after 22:00") in parsed.blocks


def test_zip_bomb_docx_is_refused_before_it_is_unpacked(monkeypatch):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("word/document.xml", "<w:document/>")
        archive.writestr("word/media/bomb.bin", b"\x00" * (8 * 1024 * 1024))
    data = out.getvalue()
    assert len(data) < 100_000
    with pytest.raises(UploadError, match="zip bomb"):
        parse(data, "bomb.docx")
    monkeypatch.setattr(parsing, "DOCX_MAX_UNPACKED", 1024 * 1024)
    with pytest.raises(UploadError, match="zip bomb"):
        parsing.check_zip_bomb(data)


# -- chunking --------------------------------------------------------------------------------------
def test_chunks_follow_sections_and_keep_the_heading_path():
    chunks = chunk_blocks(parse(HANDBOOK.encode(), "h.md").blocks, max_tokens=200)
    # the single H1 is the title: not part of every path
    assert [c.section for c in chunks] == ["3. HR 人力资源", "3. HR 人力资源 › Payroll", "2. IT"]
    assert "Annual leave" in chunks[0].text and "Sick leave" in chunks[0].text
    assert chunks[1].indexed_text.startswith("3. HR 人力资源 › Payroll\n")
    assert [c.ordinal for c in chunks] == [0, 1, 2]


def test_long_sections_are_packed_and_cut_at_sentences_within_the_size():
    para = "。".join(f"第{i}条规定员工需要遵守公司的各项制度和流程" for i in range(40)) + "。"
    blocks = [Block("手册", 1), Block("制度", 2), Block(para), Block("短段落。"), Block("x " * 500)]
    chunks = chunk_blocks(blocks, max_tokens=60)
    assert len(chunks) > 10
    assert all(c.tokens <= 60 for c in chunks)
    assert all(c.section == "制度" for c in chunks)
    assert chunks[0].text.endswith("。")  # cut at a sentence end
    joined = "".join(c.text for c in chunks)
    assert all(f"第{i}条" in joined for i in range(40)) and "短段落" in joined


def test_a_long_table_is_cut_between_rows_each_piece_under_its_header():
    rows = [f"| Team {n} | ext. {8000 + n} | team{n}@example.com |" for n in range(30)]
    table = "\n".join(["| Team | Extension | Email |", "|---|---|---|", *rows])
    blocks = parse(f"# Contacts\n\n## Key contacts\n\n{table}\n".encode(), "contacts.md").blocks
    chunks = chunk_blocks(blocks, max_tokens=40)
    assert len(chunks) > 3
    for chunk in chunks:
        lines = chunk.text.split("\n")
        assert lines[:2] == ["| Team | Extension | Email |", "|---|---|---|"]
        assert chunk.tokens <= 40 and len(lines) > 2
    kept = [line for chunk in chunks for line in chunk.text.split("\n")[2:]]
    assert kept == rows  # every row once, in order, none cut apart
    plain = chunk_blocks(blocks, max_tokens=40, table_headers=False)  # KB_TABLE_HEADERS=false
    assert sum(chunk.text.count("| Team | Extension |") for chunk in plain) == 1


def test_a_table_row_longer_than_a_chunk_is_cut_like_a_paragraph():
    long_row = "| Policy | " + " ".join(f"word{n}." for n in range(60)) + " |"
    table = "\n".join(["| Name | Text |", "|---|---|", "| Short | fine |", long_row])
    chunks = chunk_blocks([Block(table)], max_tokens=30)
    assert all(chunk.tokens <= 30 for chunk in chunks)
    assert chunks[0].text.startswith("| Name | Text |")


def test_count_tokens_cjk_chars_and_words():
    assert count_tokens("年假 annual leave 10 days") == 6
    assert count_tokens("") == 0


# -- terms -----------------------------------------------------------------------------------------
def test_terms_segment_chinese_and_lowercase_english_without_stopwords():
    found = terms("VPN 密码忘了怎么办？The Annual Leave days")
    assert {"vpn", "密码", "annual", "leav", "day"} <= set(found)  # stemmed like the documents
    assert not {"the", "怎么办", "了"} & set(found)
    assert "~密码" in found  # character pairs back up jieba's cuts
    assert "it" in terms("IT help desk")
    # pronouns and a modal are no words to find ("must ... register them")
    assert terms("how early must I register them?") == ["early", "register"]


def test_a_question_word_and_its_measure_are_no_terms():
    """"几次", "多长时间", "哪天": the number asked for is the answer, not a word to find."""
    words = {t for t in terms("密码输错几次会被锁住，锁多长时间？工资哪天发？") if not t.startswith("~")}
    assert {"密码", "输错", "锁住", "工资"} <= words
    assert not {"几次", "多长", "时间", "长时间", "多长时间", "哪天", "哪天发"} & words
    assert "时间" in terms("核心工作时间为 10:00")  # a document's 时间 stays
    # "什么时候" asks "when": its 时候 is no more a word to find than 几点's 点
    assert {t for t in terms("生日假什么时候休？") if not t.startswith("~")} == {"生日", "假", "休"}


def test_term_hashes_are_keyed_64_bit_integers():
    a, b = TermHasher(b"k" * 32), TermHasher(b"j" * 32)
    assert a("年假") == a("年假") != b("年假")
    assert -(2**63) <= a("vpn") < 2**63


def test_embedding_client_batches_orders_and_normalizes():
    import numpy as np

    from app.knowledge.embeddings import EmbeddingClient, EmbeddingError

    calls = []

    class Session:
        def post(self, url, json, headers, timeout):
            calls.append((url, json, headers))

            class Resp:
                def raise_for_status(self):
                    pass

                def json(self):
                    data = [{"index": i, "embedding": [3.0, 4.0 + i]} for i in range(len(json["input"]))]
                    return {"data": list(reversed(data))}

            return Resp()

    client = EmbeddingClient("http://emb:8000/v1/", "bge-m3", "k", session=Session())
    vectors = client.embed([f"t{i}" for i in range(70)])
    assert len(vectors) == 70 and len(calls) == 2  # batches of 64
    assert calls[0][0] == "http://emb:8000/v1/embeddings" and calls[0][2] == {"Authorization": "Bearer k"}
    assert np.allclose(vectors[0], [0.6, 0.8]) and abs(np.linalg.norm(vectors[5]) - 1) < 1e-6

    class Broken:
        def post(self, *a, **k):
            import requests

            raise requests.ConnectionError("down")

    with pytest.raises(EmbeddingError):
        EmbeddingClient("http://x/v1", "m", session=Broken()).embed(["a"])
