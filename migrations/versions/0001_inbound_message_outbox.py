"""inbound message outbox

Revision ID: 0001
Revises:
Create Date: 2026-12-02 16:03:25.544470
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('inbound_messages',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('dedup_hash', sa.String(length=64), nullable=False),
    sa.Column('channel', sa.String(length=16), nullable=False),
    sa.Column('agent_id', sa.Integer(), nullable=True),
    sa.Column('user_hash', sa.String(length=64), nullable=False),
    sa.Column('user_enc', sa.Text(), nullable=True),
    sa.Column('msg_type', sa.String(length=32), nullable=False),
    sa.Column('event', sa.String(length=32), nullable=True),
    sa.Column('payload_enc', sa.Text(), nullable=True),
    sa.Column('wecom_create_time', sa.BigInteger(), nullable=False),
    sa.Column('request_id', sa.String(length=32), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('lease_owner', sa.String(length=64), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reply_enc', sa.Text(), nullable=True),
    sa.Column('reply_kind', sa.String(length=16), nullable=True),
    sa.Column('chunks_total', sa.Integer(), nullable=True),
    sa.Column('chunks_sent', sa.Integer(), nullable=False),
    sa.Column('failure_reason', sa.String(length=120), nullable=True),
    sa.Column('model', sa.String(length=64), nullable=True),
    sa.Column('prompt_tokens', sa.Integer(), nullable=True),
    sa.Column('completion_tokens', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('answered_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedup_hash')
    )
    with op.batch_alter_table('inbound_messages', schema=None) as batch_op:
        batch_op.create_index('ix_inbound_status_enqueued', ['status', 'enqueued_at'], unique=False)
        batch_op.create_index('ix_inbound_user_order', ['user_hash', 'id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('inbound_messages', schema=None) as batch_op:
        batch_op.drop_index('ix_inbound_user_order')
        batch_op.drop_index('ix_inbound_status_enqueued')

    op.drop_table('inbound_messages')
