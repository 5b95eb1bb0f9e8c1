"""An upload's bytes -> its blocks (headings and paragraphs), the file type found by content.

The file name's extension is only a hint: a PDF is a PDF because it begins with ``%PDF-``, a
DOCX because it is a zip holding ``word/document.xml``; a file whose name and content disagree
(a "report.pdf" that is really a PNG, a ".docx" that is text) is refused, since an upload form
that trusts names feeds anything to a parser. Every refusal is an ``UploadError`` whose message
says what to do, raised before anything is written.

Limits: the upload's size (``KB_MAX_UPLOAD_BYTES``), a DOCX's unpacked size and compression
ratio (a zip bomb unpacks 10 kB into gigabytes: the zip directory is checked before python-docx
opens a member), a PDF's pages and the content they make the parser read (pages may share one
content stream: a 16 KB file of 100 pages had its 3 MB of drawing operators read 100 times,
4 s of CPU each), and the extracted text's length. Cost is bounded, not only size: PDF, DOCX
and HTML are read in a child process under CPU-time and memory limits
(``app.knowledge.sandbox``).
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser

TYPES = ("markdown", "text", "html", "pdf", "docx")
EXTENSIONS = {
    ".md": "markdown", ".markdown": "markdown", ".txt": "text", ".text": "text",
    ".html": "html", ".htm": "html", ".pdf": "pdf", ".docx": "docx",
}
MAX_UPLOAD_BYTES = 20 * 1024 * 1024
MAX_TEXT_CHARS = 2_000_000
DOCX_MAX_UNPACKED = 100 * 1024 * 1024
DOCX_MAX_RATIO = 100
DOCX_MAX_MEMBERS = 2000
MAX_PDF_PAGES = 1000
MAX_PDF_CONTENT_BYTES = 32 * 1024 * 1024  # page content streams read, all pages together
SANDBOXED = ("pdf", "docx", "html")  # read in the child process (app.knowledge.sandbox)


class UploadError(ValueError):
    """An upload that cannot become a document; the message is for the person uploading."""


@dataclass(frozen=True)
class Block:
    """A heading (``level`` 1-6) or a paragraph (``level`` 0) of a document, in order."""

    text: str
    level: int = 0


@dataclass(frozen=True)
class Parsed:
    doc_type: str
    blocks: list[Block]

    @property
    def text(self) -> str:
        """The document as Markdown-like text: what is sealed and kept as the document's text."""
        return "\n\n".join(("#" * b.level + " " + b.text) if b.level else b.text for b in self.blocks)


# -- detection -------------------------------------------------------------------------------------
def _declared_type(filename: str | None) -> str | None:
    if not filename:
        return None
    lowered = filename.lower()
    for ext, kind in EXTENSIONS.items():
        if lowered.endswith(ext):
            return kind
    return None


BINARY_MAGIC = {
    b"\x89PNG": "a PNG image", b"\xff\xd8\xff": "a JPEG image", b"GIF8": "a GIF image",
    b"\xd0\xcf\x11\xe0": "an old Office file (.doc/.xls: save it as .docx)",
    b"MZ": "a Windows program", b"\x7fELF": "a program", b"\x1f\x8b": "a gzip archive",
    b"Rar!": "a RAR archive", b"7z\xbc\xaf": "a 7z archive",
}
HTML_START = re.compile(rb"^\s*(<!--.*?-->\s*)*<(!doctype\s+html|html|head|body)\b", re.I | re.S)


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without BOM), else GB18030 (Windows' Chinese text files); no binary."""
    if b"\x00" in data[:8192]:
        raise UploadError("this is a binary file, not text: upload Markdown, text, HTML, PDF or DOCX")
    for encoding in ("utf-8-sig", "gb18030"):
        try:
            text = data.decode(encoding)
            break
        except UnicodeDecodeError:
            continue
    else:
        raise UploadError("the text is neither UTF-8 nor GB18030: save it as UTF-8 and upload again")
    controls = sum(1 for c in text[:20000] if ord(c) < 32 and c not in "\t\n\r\f")
    if controls > 10:
        raise UploadError("this is a binary file, not text: upload Markdown, text, HTML, PDF or DOCX")
    return text


def detect(data: bytes, filename: str | None = None) -> str:
    """The file's type by content; an ``UploadError`` when unsupported or its name disagrees."""
    declared = _declared_type(filename)
    if data.startswith(b"%PDF-"):
        found = "pdf"
    elif data.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = set(archive.namelist())
        except (zipfile.BadZipFile, ValueError):
            raise UploadError("the file is a damaged zip/DOCX archive") from None
        if "word/document.xml" not in names:
            raise UploadError("this zip archive is not a Word document (.docx); "
                              "upload Markdown, text, HTML, PDF or DOCX")
        found = "docx"
    else:
        for magic, what in BINARY_MAGIC.items():
            if data.startswith(magic):
                raise UploadError(f"this is {what}, which the knowledge base does not read; "
                                  "upload Markdown, text, HTML, PDF or DOCX")
        head = data[:4096]
        if HTML_START.match(head):
            found = "html"
        else:
            decode_text(data)  # refuses binary
            found = declared if declared in ("markdown", "text", "html") else None
            if found is None:
                found = "markdown" if re.search(rb"(?m)^#{1,6} \S", data) else "text"
    if declared is not None and declared != found:
        text_kinds = ("markdown", "text", "html")
        if not (declared in text_kinds and found in text_kinds):
            raise UploadError(f"the file is named like {declared.upper()} but its content is "
                              f"{found.upper()}: check that you picked the right file")
    return found


# -- parsers ---------------------------------------------------------------------------------------
MD_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LIST_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,3}[.)])\s+")


def parse_markdown(text: str) -> list[Block]:
    """Headings (ATX ``#``) and paragraphs; a list's items are paragraphs of their own (a handbook
    keeps one fact per item), a table or fenced code block stays whole."""
    blocks: list[Block] = []
    current: list[str] = []
    in_fence = False

    def flush():
        if current:
            joined = "\n".join(current).strip()
            if joined:
                blocks.append(Block(joined))
            current.clear()

    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            if not in_fence:
                flush()
            in_fence = not in_fence
            current.append(line)
            if not in_fence:
                flush()
            continue
        if in_fence:
            current.append(line)
            continue
        heading = MD_HEADING.match(line)
        if heading:
            flush()
            title = heading.group(2).strip()
            if title:
                blocks.append(Block(title, len(heading.group(1))))
            continue
        if not stripped:
            flush()
            continue
        if LIST_ITEM.match(line) and not line.startswith((" ", "\t")):
            flush()  # a new top-level item
        elif current and current[-1].lstrip().startswith("|") != stripped.startswith("|"):
            flush()  # a table begins or ends
        current.append(line.rstrip())
    flush()
    return blocks


def parse_text(text: str) -> list[Block]:
    """Paragraphs separated by blank lines; plain text has no headings."""
    paragraphs = re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n"))
    return [Block(p.strip()) for p in paragraphs if p.strip()]


class _HTMLBlocks(HTMLParser):
    BLOCK_TAGS = {"p", "div", "li", "tr", "br", "section", "article", "blockquote", "pre",
                  "table", "ul", "ol", "dd", "dt", "header", "footer", "main", "aside"}
    SKIP_TAGS = {"script", "style", "noscript", "template", "head", "svg", "iframe", "object"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self._text: list[str] = []
        self._heading = 0
        self._skip = 0

    def _flush(self, level: int = 0):
        text = re.sub(r"[ \t\r\f\v]+", " ", "".join(self._text)).strip()
        text = re.sub(r"\s*\n\s*", "\n", text)
        if text:
            self.blocks.append(Block(text, level))
        self._text = []

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP_TAGS:
            self._skip += 1
        elif re.fullmatch(r"h[1-6]", tag):
            self._flush()
            self._heading = int(tag[1])
        elif tag in ("td", "th"):
            self._text.append(" | ")
        elif tag in self.BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag):
        if tag in self.SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
        elif re.fullmatch(r"h[1-6]", tag) and self._heading:
            self._flush(self._heading)
            self._heading = 0
        elif tag in self.BLOCK_TAGS:
            self._flush()

    def handle_data(self, data):
        if not self._skip:
            self._text.append(data)


def parse_html(text: str) -> list[Block]:
    parser = _HTMLBlocks()
    parser.feed(text)
    parser.close()
    parser._flush()
    return parser.blocks


def parse_pdf(data: bytes) -> list[Block]:
    """Text per page (a PDF has no reliable headings): a page is a section, "p. N"."""
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            raise UploadError("the PDF is encrypted (password protected): "
                              "remove the password and upload it again")
        pages = reader.pages
        if len(pages) > MAX_PDF_PAGES:
            raise UploadError(f"the PDF has {len(pages)} pages; at most {MAX_PDF_PAGES}")
        blocks: list[Block] = []
        total = content = 0
        for number, page in enumerate(pages, 1):
            content += _content_bytes(page)
            if content > MAX_PDF_CONTENT_BYTES:
                raise UploadError(f"the PDF's pages hold more than {MAX_PDF_CONTENT_BYTES // 2**20} MB "
                                  f"of drawing instructions (by page {number}): too costly to read; "
                                  "print it to a simpler PDF, or upload a DOCX")
            text = page.extract_text() or ""
            total += len(text)
            if total > MAX_TEXT_CHARS:
                raise UploadError("the PDF holds too much text for one document: split it")
            paragraphs = parse_text(text)
            if paragraphs:
                blocks.append(Block(f"p. {number}", 1))
                blocks.extend(paragraphs)
    except UploadError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError, IndexError,
            RecursionError, OSError, AssertionError, ZeroDivisionError):
        raise UploadError("the PDF is damaged and cannot be read: export it again and upload") from None
    if not blocks:
        raise UploadError("the PDF has no text layer (a scan?): upload a PDF with text or a DOCX")
    return blocks


def _content_bytes(page) -> int:
    """The decoded size of the content streams a page makes the text extractor read (pages
    that share one stream each count it: each is read again)."""
    contents = page.get("/Contents")
    if contents is None:
        return 0
    contents = contents.get_object()
    streams = contents if isinstance(contents, list) else [contents]
    return sum(len(stream.get_object().get_data()) for stream in streams)


def check_zip_bomb(data: bytes) -> None:
    """Refuse a DOCX whose members unpack too large or too well (a zip bomb), before reading."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, ValueError):
        raise UploadError("the DOCX archive is damaged") from None
    if len(infos) > DOCX_MAX_MEMBERS:
        raise UploadError("the DOCX holds too many parts (a zip bomb?)")
    unpacked = sum(info.file_size for info in infos)
    if unpacked > DOCX_MAX_UNPACKED:
        raise UploadError(f"the DOCX unpacks to {unpacked // (1024 * 1024)} MB, over the "
                          f"{DOCX_MAX_UNPACKED // (1024 * 1024)} MB limit (a zip bomb?)")
    for info in infos:
        if info.file_size > 1024 * 1024 and info.file_size > DOCX_MAX_RATIO * max(info.compress_size, 1):
            raise UploadError("the DOCX is compressed suspiciously well (a zip bomb?) and is refused")


def parse_docx(data: bytes) -> list[Block]:
    """Paragraphs; "Heading N" and "Title" styles are headings; a table's rows are paragraphs."""
    check_zip_bomb(data)
    import docx
    from docx.oxml.ns import qn

    try:
        document = docx.Document(io.BytesIO(data))
        blocks: list[Block] = []
        body = document.element.body
        paragraphs = {p._p: p for p in document.paragraphs}
        tables = {t._tbl: t for t in document.tables}
        for child in body.iterchildren():
            if child.tag == qn("w:p") and child in paragraphs:
                paragraph = paragraphs[child]
                text = paragraph.text.strip()
                if not text:
                    continue
                style = (paragraph.style.name if paragraph.style is not None else "") or ""
                match = re.match(r"(?i)heading\s*(\d)", style)
                level = int(match.group(1)) if match else (1 if style.lower() == "title" else 0)
                blocks.append(Block(text, min(level, 6)))
            elif child.tag == qn("w:tbl") and child in tables:
                for row in tables[child].rows:
                    cells = [c.text.strip() for c in row.cells]
                    line = " | ".join(dict.fromkeys(c for c in cells if c))
                    if line:
                        blocks.append(Block(line))
    except UploadError:
        raise
    except Exception:  # noqa: BLE001 - python-docx raises many kinds on a malformed part
        raise UploadError("the DOCX is damaged and cannot be read: save it again and upload") from None
    return blocks


def extract_blocks(data: bytes, kind: str) -> list[Block]:
    """The blocks of a document of a known ``kind``, in this process (the child process of
    ``app.knowledge.sandbox`` runs this for PDF, DOCX and HTML)."""
    if kind == "pdf":
        return parse_pdf(data)
    if kind == "docx":
        return parse_docx(data)
    text = decode_text(data)
    if len(text) > MAX_TEXT_CHARS:
        raise UploadError("the document holds too much text for one document: split it")
    return {"markdown": parse_markdown, "text": parse_text, "html": parse_html}[kind](text)


def parse(data: bytes, filename: str | None = None, max_bytes: int = MAX_UPLOAD_BYTES) -> Parsed:
    """The document in ``data`` (refused with an ``UploadError`` saying why)."""
    if not data:
        raise UploadError("the file is empty")
    if len(data) > max_bytes:
        raise UploadError(f"the file is {len(data) / 1048576:.1f} MB; the limit is "
                          f"{max_bytes / 1048576:.1f} MB")
    kind = detect(data, filename)
    if kind in SANDBOXED:
        from app.knowledge import sandbox  # here: the sandbox's child loads this file by path

        try:
            blocks = [Block(text, level) for text, level in sandbox.extract(data, kind)]
        except sandbox.Unreadable as exc:
            raise UploadError(str(exc)) from None
    else:
        blocks = extract_blocks(data, kind)
    if not any(b.level == 0 for b in blocks):
        raise UploadError("no text found in the document")
    if sum(len(b.text) for b in blocks) > MAX_TEXT_CHARS:
        raise UploadError("the document holds too much text for one document: split it")
    return Parsed(kind, blocks)
