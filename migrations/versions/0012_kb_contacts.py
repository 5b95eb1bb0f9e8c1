"""kb_documents.contacts_enc: who owns each section of a document (app.knowledge.contacts)

A "not found" names the team that owns the topic: the document's sections' contacts (from its
contacts table or a section's own contact line) and the admin's contact for the whole
document, as sealed JSON. NULL for documents indexed before: their declines name
KB_FALLBACK_CONTACT until they are uploaded again or re-indexed.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 18:30:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('kb_documents') as batch:
        batch.add_column(sa.Column('contacts_enc', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('kb_documents') as batch:
        batch.drop_column('contacts_enc')
