"""Which documents an answer cited, and which of them the 👎 keep landing on.

``record`` writes, when a model answer is stored (before it is sent), one ``answer_sources`` row
per passage of the knowledge base it cites: its number, the document and chunk ids, a blind
index of (document, section) and "title › section" sealed (a title can say what the company
keeps in its documents, so it is sealed like them). A file the employee sent is not recorded.
A retried task writes nothing twice (``(message_id, position)`` is unique).

``worst_sources`` is the dashboard's report (admin role only): for the rated answers in a range,
grouped by cited document and section, the 👎 and 👍 counts, the share helpful, the reasons given
(the app card's and the AI bot's codes, ``app.feedback.ratings.REASONS``) and the newest 👎 answers' ids,
worst first, so the admins see which documents to fix.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import date

from sqlalchemy import case, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.feedback.ratings import reason_labels
from app.models import AnswerRating, AnswerSource

log = logging.getLogger(__name__)
TABLE = AnswerSource.__tablename__
_PURPOSE = "answer-source"


def section_key(blind_index, document_id: int, section: str) -> str:
    return blind_index(_PURPOSE, f"{int(document_id)}\0{section}")


def record(services, message_id: int, passages) -> int:
    """Store the knowledge-base passages (``app.knowledge.retrieval.Passage``) an answer cites,
    numbered from 1 in citing order; files (document id 0) left out. How many were stored."""
    cited = [p for p in passages if p.document_id > 0]
    if not cited:
        return 0
    try:
        with services.db.transaction() as session:
            if session.scalar(select(AnswerSource.id).where(AnswerSource.message_id == message_id).limit(1)):
                return 0  # a retried task: recorded by its first attempt
            for position, passage in enumerate(cited, 1):
                row = AnswerSource(message_id=message_id, position=position, document_id=passage.document_id,
                                   chunk_id=passage.chunk_id,
                                   section_key=section_key(services.blind_index, passage.document_id,
                                                           passage.section))
                session.add(row)
                session.flush()
                row.source_enc = services.cipher.encrypt(passage.source, TABLE, "source_enc", row.id)
    except IntegrityError:  # a concurrent attempt of the same message won
        return 0
    return len(cited)


def worst_sources(session: Session, services, since: date, until: date, department: str | None = None,
                  limit: int = 10) -> list[dict]:
    """The cited sections with the most 👎 in the range (ties: the lower share helpful first)."""
    down = func.sum(case((AnswerRating.rating < 0, 1), else_=0)).label("down")
    up = func.sum(case((AnswerRating.rating > 0, 1), else_=0)).label("up")
    where = [AnswerRating.day >= since, AnswerRating.day <= until, AnswerRating.rating != 0]
    if department is not None:
        where.append(AnswerRating.department == department)
    joined = select(AnswerSource.document_id, AnswerSource.section_key, down, up,
                    func.min(AnswerSource.id).label("sample")) \
        .join(AnswerRating, AnswerRating.message_id == AnswerSource.message_id) \
        .where(*where).group_by(AnswerSource.document_id, AnswerSource.section_key)
    groups = [g for g in session.execute(joined) if (g.down or 0) > 0]
    groups.sort(key=lambda g: (-g.down, g.up / (g.up + g.down), g.sample))
    groups = groups[:limit]
    if not groups:
        return []
    samples = {r.id: r.source_enc for r in session.execute(
        select(AnswerSource.id, AnswerSource.source_enc).where(AnswerSource.id.in_([g.sample for g in groups])))}
    bad = session.execute(
        select(AnswerSource.document_id, AnswerSource.section_key, AnswerRating.message_id, AnswerRating.reasons)
        .join(AnswerRating, AnswerRating.message_id == AnswerSource.message_id)
        .where(*where, AnswerRating.rating < 0,
               AnswerSource.section_key.in_([g.section_key for g in groups]))
        .order_by(AnswerRating.created_at.desc(), AnswerRating.id.desc())).all()
    report = []
    for g in groups:
        mine = [b for b in bad if (b.document_id, b.section_key) == (g.document_id, g.section_key)]
        reasons = Counter(label for b in mine for label in reason_labels(b.reasons))
        report.append({
            "document_id": g.document_id, "source": _source(services, g.sample, samples.get(g.sample)),
            "down": int(g.down), "up": int(g.up or 0),
            "percent": round(100.0 * (g.up or 0) / (g.up + g.down), 1),
            "reasons": [f"{label} ×{n}" for label, n in reasons.most_common()],
            "messages": list(dict.fromkeys(b.message_id for b in mine))[:5]})
    return report


def _source(services, row_id: int, sealed: str | None) -> str:
    try:
        return services.cipher.decrypt(sealed, TABLE, "source_enc", row_id) if sealed else "(not recorded)"
    except Exception:  # noqa: BLE001 - sealed under a retired key: say so, show the rest
        log.warning("answer source not decrypted id=%s", row_id)
        return "(not available)"
