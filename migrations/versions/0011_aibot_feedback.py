"""answer_ratings.reasons: the AI bot's 👎 reason codes (app.feedback.ratings, feedback_event)

The AI bot's ratings share answer_ratings with the app channel's (channel ``aibot``); a
withdrawn one is kept with rating 0, and the free text of a 👎 is a sealed feedback_comments
row, so the one thing missing was WeCom's ``inaccurate_reason_list`` (codes 1-4, ``"1,3"``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 03:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('answer_ratings') as batch:
        batch.add_column(sa.Column('reasons', sa.String(32), nullable=False, server_default=''))


def downgrade() -> None:
    with op.batch_alter_table('answer_ratings') as batch:
        batch.drop_column('reasons')
