"""answer_sources: the passages (document, section) each answer cited, for the 👎 report

An answer's sources are recorded when it is stored, before it is sent: one row per cited
passage, its number in the answer, the document and chunk ids, a keyed hash of (document,
section) that the report groups by without decrypting, and "title › section" sealed (document
titles are sealed everywhere else too). The dashboard's feedback area lists the worst-rated
sources, so the documents behind bad answers get fixed (app.feedback.sources).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 19:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'answer_sources',
        sa.Column('id', BigInt, primary_key=True, autoincrement=True),
        sa.Column('message_id', BigInt, nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('document_id', BigInt, nullable=False),
        sa.Column('chunk_id', BigInt, nullable=False),
        sa.Column('section_key', sa.String(64), nullable=False),
        sa.Column('source_enc', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('message_id', 'position', name='uq_answer_sources_message_position'),
    )
    op.create_index('ix_answer_sources_section', 'answer_sources', ['document_id', 'section_key'])


def downgrade() -> None:
    op.drop_index('ix_answer_sources_section', table_name='answer_sources')
    op.drop_table('answer_sources')
