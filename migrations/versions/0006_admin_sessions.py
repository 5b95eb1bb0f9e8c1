"""admin sessions kept server-side (revoked at logout, absolute lifetime)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 22:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('admin_sessions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['admin_users.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_admin_sessions_user', 'admin_sessions', ['user_id'], unique=False)
    op.create_index('ix_admin_sessions_expires', 'admin_sessions', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_admin_sessions_expires', table_name='admin_sessions')
    op.drop_index('ix_admin_sessions_user', table_name='admin_sessions')
    op.drop_table('admin_sessions')
