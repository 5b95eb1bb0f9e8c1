"""Adding, replacing and removing documents: sealed text, hashed postings, one audit event each.

An upload is parsed, chunked and its terms hashed *before* the transaction opens (the slow part
holds no lock); the transaction then swaps the document's chunks and postings and appends the
audit event, so a reader sees the old version or the new one, never a mix, and a failure
anywhere leaves the old version whole.

A re-upload is recognized by the document id or by its title (a blind index of the normalized
title, so titles are not stored in clear); one whose text, type and visibility are unchanged is
left alone and reported ``unchanged`` (``make run`` loads the handbook at every start).
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete, insert, select

from app.audit.chain import EventType
from app.db import utcnow
from app.knowledge import contacts as contact_rules
from app.knowledge.chunking import Chunk, chunk_blocks
from app.knowledge.embeddings import EmbeddingError, client_from, seal_vector
from app.knowledge.parsing import Parsed, UploadError, parse
from app.knowledge.terms import INDEX_VERSION, terms
from app.models import (
    KnowledgeChunk,
    KnowledgeDocument,
    KnowledgeDocumentDepartment,
    KnowledgePosting,
    KnowledgeVisibility,
)
from app.wecom.departments import DepartmentIdError, department_id, department_ids

CHUNK_ID_SPAN = 1_000_000  # a chunk's id: document id * span + ordinal
MAX_CHUNKS = CHUNK_ID_SPAN - 1
DOCS = KnowledgeDocument.__tablename__
CHUNKS = KnowledgeChunk.__tablename__


def normalize_title(title: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", title)).strip().casefold()


def title_hashes(blind_index, title: str) -> list[str]:
    """The title's digest under the current key first, then under older keys of the ring."""
    normalized = normalize_title(title)
    candidates = getattr(blind_index, "candidates", None)
    return candidates("kb-title", normalized) if candidates else [blind_index("kb-title", normalized)]


@dataclass
class Prepared:
    """An upload made ready outside the transaction: parsed, chunked, hashed."""

    parsed: Parsed
    chunks: list[Chunk]
    postings: list[dict[int, int]]  # per chunk: term hash -> frequency
    lengths: list[int]
    vectors: list | None = None  # per chunk, when an embeddings server is configured


@dataclass
class AddResult:
    document_id: int
    status: str  # added | replaced | unchanged
    chunks: int
    doc_type: str


@dataclass
class DocumentInfo:
    id: int
    title: str
    doc_type: str
    visibility: str
    departments: list[int]
    chunks: int
    size_bytes: int
    version: int
    updated_at: datetime
    filename: str | None = None
    contact: str = ""  # the admin's, for the whole document
    extra: dict = field(default_factory=dict)


def parse_departments(spec: str | None) -> list[int]:
    """``"1,2"`` -> [1, 2]; empty or None -> [] (everyone); ``UploadError`` for anything that is
    not a list of WeCom department ids (``app.wecom.departments``)."""
    try:
        return department_ids(spec)
    except DepartmentIdError as exc:
        raise UploadError(f"departments must be WeCom department ids like '1,2': {exc}") from None


COPY_POSTINGS = "COPY kb_postings (term, chunk_id, document_id, tf, dl) FROM STDIN"
INSERT_POSTINGS = "INSERT INTO kb_postings (term, chunk_id, document_id, tf, dl) VALUES (?, ?, ?, ?, ?)"


def _insert_postings(session, rows: list[tuple]) -> None:
    """The postings on the driver's cursor, in the session's transaction: COPY on PostgreSQL,
    executemany on SQLite, in key order (a WITHOUT ROWID table then appends instead of
    splitting pages). Through Core each row's dict cost several times the insert itself, and a
    document has a posting per distinct term of each chunk (about 60 a chunk)."""
    if not rows:
        return
    connection = session.connection()
    cursor = connection.connection.dbapi_connection.cursor()
    try:
        if connection.dialect.name == "postgresql":
            with cursor.copy(COPY_POSTINGS) as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            cursor.executemany(INSERT_POSTINGS, rows)
    finally:
        cursor.close()


class KnowledgeStore:
    def __init__(self, services):
        self.services = services
        self.settings = services.settings
        self.cipher = services.cipher
        self.hasher = services.knowledge_caches.term_hasher
        self.embedder = client_from(self.settings)

    # -- preparing -----------------------------------------------------------------------------
    def prepare(self, data: bytes, filename: str | None = None) -> Prepared:
        parsed = parse(data, filename, max_bytes=self.settings.kb_max_upload_bytes)
        return self.prepare_parsed(parsed)

    def prepare_parsed(self, parsed: Parsed) -> Prepared:
        chunks = chunk_blocks(parsed.blocks, self.settings.kb_chunk_tokens, self.settings.kb_table_headers)
        if not chunks:
            raise UploadError("no text found in the document")
        if len(chunks) > MAX_CHUNKS:
            raise UploadError("the document is too long: split it")
        postings, lengths = [], []
        for chunk in chunks:
            counts = Counter(terms(chunk.indexed_text))
            hashed: dict[int, int] = {}
            for term, tf in counts.items():
                key = self.hasher(term)
                hashed[key] = hashed.get(key, 0) + tf
            postings.append(hashed)
            lengths.append(sum(counts.values()))
        vectors = None
        if self.embedder is not None:
            try:
                vectors = self.embedder.embed([c.indexed_text for c in chunks])
            except EmbeddingError as exc:
                raise UploadError(f"{exc}: try again, or unset EMBEDDINGS_BASE_URL") from None
        return Prepared(parsed, chunks, postings, lengths, vectors)

    def vectors_missing_here(self) -> bool:
        """Whether a document added now would lack what the others have: vectors (this process
        has no ``EMBEDDINGS_BASE_URL``, the stack that added them had one). Dense retrieval
        would never rank it: a CLI run without the stack's settings (``var/stack.env``)."""
        if self.embedder is not None:
            return False
        with self.services.db.reader() as session:
            return session.scalar(select(KnowledgeChunk.id).where(KnowledgeChunk.vector_enc.is_not(None))
                                  .limit(1)) is not None

    # -- writing -------------------------------------------------------------------------------
    def add(self, data: bytes, title: str, *, filename: str | None = None,
            departments: list[int] | None = None, document_id: int | None = None,
            actor: str = "cli", contact: str | None = None) -> AddResult:
        """Add a document, or replace the one with this id or title; ``UploadError`` if refused.
        ``contact``: the team a "not found" names for this document's topics where its own
        sections do not say (app.knowledge.contacts)."""
        title = (title or "").strip()
        if not title:
            raise UploadError("a document needs a title")
        if len(title) > 200:
            raise UploadError("the title is longer than 200 characters")
        try:
            contact = contact_rules.document_contact(contact)
        except ValueError as exc:
            raise UploadError(str(exc)) from None
        prepared = self.prepare(data, filename)
        return self.write(prepared, title, filename=filename, departments=departments or [],
                          document_id=document_id, actor=actor, size_bytes=len(data),
                          contact=contact)

    def write(self, prepared: Prepared, title: str, *, filename: str | None = None,
              departments: list[int], document_id: int | None = None, actor: str = "cli",
              size_bytes: int = 0, audit: bool = True, force: bool = False,
              contact: str = "") -> AddResult:
        try:
            departments = sorted({department_id(d) for d in departments})
        except DepartmentIdError as exc:
            raise UploadError(f"departments must be WeCom department ids: {exc}") from None
        bi = self.services.blind_index
        known_hashes = title_hashes(bi, title)
        title_hash = known_hashes[0]
        parsed = prepared.parsed
        text = parsed.text
        visibility = KnowledgeVisibility.DEPARTMENTS if departments else KnowledgeVisibility.ALL
        owners = contact_rules.dumps(contact_rules.section_contacts(parsed.blocks, prepared.chunks),
                                     contact)
        content_hash = bi("kb-content", f"{INDEX_VERSION}\x00{self.settings.kb_chunk_tokens}\x00"
                                        f"{bool(self.embedder)}\x00{parsed.doc_type}\x00{visibility}\x00"
                                        f"{','.join(map(str, departments))}\x00{owners}\x00{text}")
        now = utcnow()
        with self.services.db.transaction() as session:
            if document_id is not None:
                doc = session.get(KnowledgeDocument, document_id, with_for_update=True)
                if doc is None:
                    raise UploadError(f"no document {document_id}")
                clash = session.scalar(select(KnowledgeDocument.id).where(
                    KnowledgeDocument.title_hash.in_(known_hashes),
                    KnowledgeDocument.id != document_id))
                if clash is not None:
                    raise UploadError(f"another document ({clash}) already has this title")
            else:
                doc = session.scalars(select(KnowledgeDocument).where(
                    KnowledgeDocument.title_hash.in_(known_hashes)).with_for_update()).first()
            if (not force and doc is not None and doc.content_hash == content_hash
                    and doc.title_hash == title_hash):
                return AddResult(doc.id, "unchanged", doc.chunk_count, doc.doc_type)
            status = "replaced" if doc is not None else "added"
            if doc is None:
                doc = KnowledgeDocument(title_hash=title_hash, title_enc="", content_enc="",
                                        content_hash=content_hash, doc_type=parsed.doc_type,
                                        visibility=visibility, created_at=now, version=1,
                                        size_bytes=size_bytes, chunk_count=0, term_total=0,
                                        updated_by=actor[:80], updated_at=now)
                session.add(doc)
                session.flush()
            else:
                self._drop_index(session, doc.id)
                doc.version += 1
            doc.title_hash = title_hash
            doc.title_enc = self.cipher.encrypt(title, DOCS, "title_enc", doc.id)
            doc.filename_enc = (self.cipher.encrypt(filename, DOCS, "filename_enc", doc.id)
                                if filename else None)
            doc.content_enc = self.cipher.encrypt(text, DOCS, "content_enc", doc.id)
            doc.contacts_enc = self.cipher.encrypt(owners, DOCS, "contacts_enc", doc.id)
            doc.content_hash = content_hash
            doc.doc_type = parsed.doc_type
            doc.visibility = visibility
            doc.size_bytes = size_bytes
            doc.chunk_count = len(prepared.chunks)
            doc.term_total = sum(prepared.lengths)
            doc.updated_by = actor[:80]
            doc.updated_at = now
            session.flush()
            self._write_index(session, doc.id, prepared, departments)
            if audit:
                self.services.audit.append(
                    session, EventType.ADMIN_CHANGE, actor=actor[:80], outcome="ok",
                    payload={"action": "kb_reindex" if force else
                             f"kb_{'add' if status == 'added' else 'replace'}",
                             "document_id": doc.id, "title": title, "version": doc.version,
                             "doc_type": parsed.doc_type, "chunks": len(prepared.chunks),
                             "visibility": visibility, "departments": departments,
                             "contact": contact})
            return AddResult(doc.id, status, len(prepared.chunks), parsed.doc_type)

    def _write_index(self, session, document_id: int, prepared: Prepared, departments: list[int]):
        base = document_id * CHUNK_ID_SPAN
        cipher = self.cipher
        chunk_rows, posting_rows = [], []
        vectors = prepared.vectors or [None] * len(prepared.chunks)
        for chunk, hashed, length, vector in zip(prepared.chunks, prepared.postings,
                                                 prepared.lengths, vectors, strict=True):
            chunk_id = base + chunk.ordinal
            chunk_rows.append({
                "id": chunk_id, "document_id": document_id, "ordinal": chunk.ordinal,
                "section_enc": cipher.encrypt(chunk.section, CHUNKS, "section_enc", chunk_id),
                "text_enc": cipher.encrypt(chunk.text, CHUNKS, "text_enc", chunk_id),
                "tokens": chunk.tokens, "length": length,
                "vector_enc": None if vector is None else seal_vector(cipher, vector, chunk_id)})
            posting_rows.extend((term, chunk_id, document_id, tf, length)
                                for term, tf in hashed.items())
        if departments:
            session.execute(insert(KnowledgeDocumentDepartment),
                            [{"document_id": document_id, "department_id": d} for d in departments])
        for start in range(0, len(chunk_rows), 2000):
            session.execute(insert(KnowledgeChunk), chunk_rows[start:start + 2000])
        posting_rows.sort()
        _insert_postings(session, posting_rows)

    @staticmethod
    def _drop_index(session, document_id: int) -> None:
        session.execute(delete(KnowledgePosting).where(KnowledgePosting.document_id == document_id))
        session.execute(delete(KnowledgeChunk).where(KnowledgeChunk.document_id == document_id))
        session.execute(delete(KnowledgeDocumentDepartment)
                        .where(KnowledgeDocumentDepartment.document_id == document_id))

    def reindex(self, actor: str = "cli") -> int:
        """Chunk and index every document again from its sealed text (after a change of
        ``KB_CHUNK_TOKENS`` or of ``BLIND_INDEX_KEY``, which keys the term hashes)."""
        from app.knowledge.parsing import Parsed, parse_markdown

        count = 0
        for info in self.list():
            text = self.document_text(info.id)
            if text is None:
                continue
            prepared = self.prepare_parsed(Parsed(info.doc_type, parse_markdown(text)))
            self.write(prepared, info.title, filename=info.filename, departments=info.departments,
                       document_id=info.id, actor=actor, size_bytes=info.size_bytes, force=True,
                       contact=info.contact)
            count += 1
        return count

    def remove(self, document_id: int, actor: str = "cli") -> bool:
        """Delete a document with its chunks and postings (audited); False if there was none."""
        with self.services.db.transaction() as session:
            doc = session.get(KnowledgeDocument, document_id, with_for_update=True)
            if doc is None:
                return False
            title = self.cipher.decrypt(doc.title_enc, DOCS, "title_enc", doc.id)
            chunks = doc.chunk_count
            self._drop_index(session, document_id)
            session.delete(doc)
            self.services.audit.append(
                session, EventType.ADMIN_CHANGE, actor=actor[:80], outcome="ok",
                payload={"action": "kb_remove", "document_id": document_id, "title": title,
                         "chunks": chunks})
        return True

    # -- reading -------------------------------------------------------------------------------
    def list(self) -> list[DocumentInfo]:
        with self.services.db.reader() as session:
            docs = list(session.scalars(select(KnowledgeDocument).order_by(KnowledgeDocument.id)))
            depts: dict[int, list[int]] = {}
            for row in session.execute(select(KnowledgeDocumentDepartment)
                                       .order_by(KnowledgeDocumentDepartment.department_id)).scalars():
                depts.setdefault(row.document_id, []).append(row.department_id)
        out = []
        for doc in docs:
            out.append(DocumentInfo(
                id=doc.id, title=self.cipher.decrypt(doc.title_enc, DOCS, "title_enc", doc.id),
                doc_type=doc.doc_type, visibility=doc.visibility, departments=depts.get(doc.id, []),
                chunks=doc.chunk_count, size_bytes=doc.size_bytes, version=doc.version,
                updated_at=doc.updated_at,
                filename=(self.cipher.decrypt(doc.filename_enc, DOCS, "filename_enc", doc.id)
                          if doc.filename_enc else None),
                contact=read_contacts(self.cipher, doc).get("document", "")))
        return out

    def document_text(self, document_id: int) -> str | None:
        with self.services.db.reader() as session:
            doc = session.get(KnowledgeDocument, document_id)
            if doc is None:
                return None
            return self.cipher.decrypt(doc.content_enc, DOCS, "content_enc", doc.id)


def read_contacts(cipher, doc: KnowledgeDocument) -> dict:
    """A document's owners (``app.knowledge.contacts``); {} for one indexed before they were kept."""
    if not doc.contacts_enc:
        return {}
    return contact_rules.loads(cipher.decrypt(doc.contacts_enc, DOCS, "contacts_enc", doc.id))


def topic_contact(services, passage) -> str | None:
    """The team that owns ``passage``'s topic (its section's, else its document's contact), or
    None when the document does not say."""
    with services.db.reader() as session:
        doc = session.get(KnowledgeDocument, passage.document_id)
        owners = read_contacts(services.cipher, doc) if doc is not None else {}
    return contact_rules.owner(owners, passage.section)
