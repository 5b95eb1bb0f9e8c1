"""answer_ratings and feedback_comments: 👍/👎 on answers and /feedback comments (app.feedback.ratings)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

BigInt = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


def upgrade() -> None:
    op.create_table(
        'answer_ratings',
        sa.Column('id', BigInt, primary_key=True, autoincrement=True),
        sa.Column('message_id', BigInt, nullable=False),
        sa.Column('rating', sa.Integer(), nullable=False),
        sa.Column('channel', sa.String(16), nullable=False),
        sa.Column('user_hash', sa.String(64), nullable=False),
        sa.Column('department', sa.String(32), nullable=False),
        sa.Column('model', sa.String(64), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint('message_id', name='uq_answer_ratings_message'),
    )
    op.create_index('ix_ratings_day', 'answer_ratings', ['day'])
    op.create_table(
        'feedback_comments',
        sa.Column('id', BigInt, primary_key=True, autoincrement=True),
        sa.Column('message_id', BigInt, nullable=True),
        sa.Column('user_hash', sa.String(64), nullable=False),
        sa.Column('department', sa.String(32), nullable=False),
        sa.Column('day', sa.Date(), nullable=False),
        sa.Column('comment_enc', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index('ix_feedback_comments_day', 'feedback_comments', ['day'])


def downgrade() -> None:
    op.drop_index('ix_feedback_comments_day', table_name='feedback_comments')
    op.drop_table('feedback_comments')
    op.drop_index('ix_ratings_day', table_name='answer_ratings')
    op.drop_table('answer_ratings')
