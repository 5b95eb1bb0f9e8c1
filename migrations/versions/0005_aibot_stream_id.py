"""AI bot channel: the stream id of a message answered by streaming

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03 10:40:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('inbound_messages', schema=None) as batch_op:
        batch_op.add_column(sa.Column('stream_id', sa.String(length=32), nullable=True))
        batch_op.create_unique_constraint('uq_inbound_stream_id', ['stream_id'])


def downgrade() -> None:
    with op.batch_alter_table('inbound_messages', schema=None) as batch_op:
        batch_op.drop_constraint('uq_inbound_stream_id', type_='unique')
        batch_op.drop_column('stream_id')
