"""siem_cursors: how far each SIEM sink has taken the audit events and the usage rows (app.siem)

One row per (sink, stream): the last audit seq or usage row id the receiver acknowledged, moved
forward by a compare-and-set after each batch it took, so an export resumes after an outage, a
restart or a second exporter without losing or repeating what lies behind it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-08 10:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'siem_cursors',
        sa.Column('sink', sa.String(length=16), nullable=False),
        sa.Column('stream', sa.String(length=16), nullable=False),
        sa.Column('position', sa.BigInteger(), nullable=False),
        sa.Column('exported', sa.BigInteger(), nullable=False),
        sa.Column('clear_fields', sa.String(length=512), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('last_error', sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint('sink', 'stream'),
    )


def downgrade() -> None:
    op.drop_table('siem_cursors')
