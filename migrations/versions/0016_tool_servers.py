"""tool_servers, tool_policies: MCP servers an admin registers and who may use their tools (app.tools)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 22:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tool_servers',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('name', sa.String(length=64), nullable=False),
        sa.Column('transport', sa.String(length=8), nullable=False),
        sa.Column('target', sa.Text(), nullable=False),
        sa.Column('secrets_enc', sa.Text(), nullable=True),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('name'),
    )
    op.create_table(
        'tool_policies',
        sa.Column('server_id', sa.Integer(), nullable=False),
        sa.Column('tool', sa.String(length=128), nullable=False),
        sa.Column('departments', sa.String(length=1024), nullable=False),
        sa.Column('side_effect', sa.Boolean(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['server_id'], ['tool_servers.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('server_id', 'tool'),
    )


def downgrade() -> None:
    op.drop_table('tool_policies')
    op.drop_table('tool_servers')
