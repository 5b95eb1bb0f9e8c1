"""Reading a document is bounded by its cost, not its size (app/knowledge/sandbox.py,
app/knowledge/parsing.py): the issue's hostile PDF (16 KB on disk, 100 pages sharing one content
stream of drawing operators behind one empty text show: about 4 s of pypdf a page, 6-7 minutes in
all) is refused with a reason within its CPU budget, in a child process that holds no secret;
the page-content budget refuses it in-process too; a refused document changes nothing stored."""

from __future__ import annotations

import os
import time
import zlib

import pytest

from app.knowledge import parsing, sandbox
from app.knowledge.parsing import UploadError, parse
from emulator.media import pdf_document


def hostile_pdf(pages: int = 100, operators: int = 200_000) -> bytes:
    """``pages`` pages sharing one content stream: one text show of nothing, then
    ``operators`` line segments (pypdf parses them all for every page that names the stream)."""
    stream = zlib.compress(b"BT /F1 1 Tf () Tj ET\n" + b"0 0 m 1 1 l S\n" * operators, 9)
    kids = " ".join(f"{5 + i} 0 R" for i in range(pages))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{kids}] /Count {pages} /MediaBox [0 0 612 792] "
               "/Resources << /Font << /F1 3 0 R >> >> >>".encode(),  # inherited by every page
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
               b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"]
    objects += [b"<< /Type /Page /Parent 2 0 R /Contents 4 0 R >>"] * pages
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_the_hostile_pdf_is_refused_within_its_cpu_budget(monkeypatch):
    monkeypatch.setattr(sandbox, "CPU_S", 2)
    data = hostile_pdf()
    assert len(data) < 16 * 1024
    started = time.monotonic()
    cpu_before = os.times()
    with pytest.raises(UploadError, match="too costly to read .more than 2 s of processing."):
        parse(data, "report.pdf")
    children = os.times()
    spent = (children.children_user + children.children_system
             - cpu_before.children_user - cpu_before.children_system)
    print(f"refused after {time.monotonic() - started:.1f} s, {spent:.1f} s of the child's CPU")
    assert spent < 2 + 2  # the budget past the child's start-up, and that start-up


def test_the_page_content_budget_refuses_it_in_process_too(monkeypatch):
    """The same shape, cheap operators, the budget at 1 MB: refused by the page that crosses it,
    before the pages after it are read."""
    monkeypatch.setattr(parsing, "MAX_PDF_CONTENT_BYTES", 1024 * 1024)
    with pytest.raises(UploadError, match=r"more than 1 MB of drawing instructions \(by page 3[0-9]\)"):
        parsing.extract_blocks(hostile_pdf(100, 2500), "pdf")


def test_ordinary_documents_read_the_same_through_the_child():
    data = pdf_document(["Leave policy", "Annual leave is 15 days."])
    assert parse(data, "policy.pdf").blocks == parsing.extract_blocks(data, "pdf")
    html = "<html><body><h1>标题</h1><p>正文 paragraph</p><script>x()</script></body></html>".encode()
    assert [(b.text, b.level) for b in parse(html, "a.html").blocks] == [("标题", 1), ("正文 paragraph", 0)]


def test_the_child_holds_no_secret_and_refuses_what_it_cannot_read(monkeypatch):
    monkeypatch.setenv("DATA_KEYS", "k1:secret-that-must-stay-in-the-parent")
    seen = {}
    real = sandbox.subprocess.run

    def spy(argv, **kwargs):
        seen.update(argv=argv, env=kwargs["env"])
        return real(argv, **kwargs)

    monkeypatch.setattr(sandbox.subprocess, "run", spy)
    with pytest.raises(UploadError, match="damaged"):
        parse(b"%PDF-1.4\n" + os.urandom(2000), "broken.pdf")
    assert set(seen["env"]) == {"PATH", "LANG", "LC_ALL"} and "-I" in seen["argv"]
    with pytest.raises(sandbox.Unreadable, match="needs more than 8 MB|could not be read"):
        sandbox.extract(hostile_pdf(1), "pdf", memory_bytes=8 * 1024 * 1024)  # 3 MB to inflate


def test_a_refused_hostile_upload_changes_nothing_stored(services, monkeypatch):
    from app.knowledge.store import KnowledgeStore

    monkeypatch.setattr(sandbox, "CPU_S", 2)
    store = KnowledgeStore(services)
    kept = store.add(b"# Handbook\n\nAnnual leave is 15 days.", "员工手册", filename="handbook.md")
    before = [(d.id, d.version) for d in store.list()]
    with pytest.raises(UploadError, match="too costly"):
        store.add(hostile_pdf(), "员工手册", filename="handbook.pdf")
    assert [(d.id, d.version) for d in store.list()] == before and kept.chunks >= 1
