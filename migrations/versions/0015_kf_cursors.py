"""kf_cursors: how far the bot has read each 微信客服 account's messages (app.kf.sync)

One row per kf account: kf/sync_msg's next_cursor, moved by a compare-and-set in the same
transaction that writes the page's customer messages to the outbox, so a page is taken once
across workers and restarts.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 22:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'kf_cursors',
        sa.Column('open_kfid', sa.String(length=64), nullable=False),
        sa.Column('cursor', sa.String(length=128), nullable=False),
        sa.Column('synced', sa.BigInteger(), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('open_kfid'),
    )


def downgrade() -> None:
    op.drop_table('kf_cursors')
