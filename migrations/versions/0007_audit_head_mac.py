"""audit chain head sealed: the chain key's id and the head's MAC

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 00:00:00

Both start empty: the first append after the upgrade seals the head (and, on a chain with rows,
writes the chain-key key_rotation event that marks the key in use from then on). Until then
``audit verify`` reports the head as not sealed.
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('audit_chain', schema=None) as batch_op:
        batch_op.add_column(sa.Column('key_id', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('head_mac', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('audit_chain', schema=None) as batch_op:
        batch_op.drop_column('head_mac')
        batch_op.drop_column('key_id')
