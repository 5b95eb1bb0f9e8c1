"""api_keys.key_seal: the key's SHA-256 sealed, so a new BLIND_INDEX_KEY can re-compute key_hash

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05 00:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.add_column(sa.Column('key_seal', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('api_keys') as batch:
        batch.drop_column('key_seal')
