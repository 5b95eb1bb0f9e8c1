"""knowledge base: documents, their departments, sealed chunks, hashed-term postings

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05 00:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table('kb_documents',
    sa.Column('id', BigInt, autoincrement=True, nullable=False),
    sa.Column('title_hash', sa.String(length=64), nullable=False),
    sa.Column('title_enc', sa.Text(), nullable=False),
    sa.Column('filename_enc', sa.Text(), nullable=True),
    sa.Column('content_enc', sa.Text(), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('doc_type', sa.String(length=16), nullable=False),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('visibility', sa.String(length=16), nullable=False),
    sa.Column('chunk_count', sa.Integer(), nullable=False),
    sa.Column('term_total', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('updated_by', sa.String(length=80), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('title_hash')
    )
    op.create_index('ix_kb_documents_visibility', 'kb_documents', ['visibility'], unique=False)
    op.create_table('kb_document_departments',
    sa.Column('document_id', BigInt, nullable=False),
    sa.Column('department_id', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['document_id'], ['kb_documents.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('document_id', 'department_id')
    )
    op.create_index('ix_kb_docdept_department', 'kb_document_departments', ['department_id'], unique=False)
    op.create_table('kb_chunks',
    sa.Column('id', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('document_id', BigInt, nullable=False),
    sa.Column('ordinal', sa.Integer(), nullable=False),
    sa.Column('section_enc', sa.Text(), nullable=False),
    sa.Column('text_enc', sa.Text(), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('length', sa.Integer(), nullable=False),
    sa.Column('vector_enc', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['document_id'], ['kb_documents.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_kb_chunks_document', 'kb_chunks', ['document_id'], unique=False)
    op.create_table('kb_postings',
    sa.Column('term', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('chunk_id', sa.BigInteger(), autoincrement=False, nullable=False),
    sa.Column('document_id', BigInt, nullable=False),
    sa.Column('tf', sa.Integer(), nullable=False),
    sa.Column('dl', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['document_id'], ['kb_documents.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('term', 'chunk_id'),
    sqlite_with_rowid=False
    )
    op.create_index('ix_kb_postings_document', 'kb_postings', ['document_id'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_kb_postings_document', table_name='kb_postings')
    op.drop_table('kb_postings')
    op.drop_index('ix_kb_chunks_document', table_name='kb_chunks')
    op.drop_table('kb_chunks')
    op.drop_index('ix_kb_docdept_department', table_name='kb_document_departments')
    op.drop_table('kb_document_departments')
    op.drop_index('ix_kb_documents_visibility', table_name='kb_documents')
    op.drop_table('kb_documents')
