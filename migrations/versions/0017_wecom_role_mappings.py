"""wecom_role_mappings: which WeCom userids and departments may sign in to the admin site (app.sso)

One row per userid or department id and the admin role it grants; a userid's own row wins over
its departments'. The accounts those sign-ins use are ordinary ``admin_users`` rows named
``wecom:<userid>`` whose password hash is no hash at all, so no password opens them.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-07 22:00:00
"""

from alembic import op
import sqlalchemy as sa


revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'wecom_role_mappings',
        sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True,
                  nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('value', sa.String(length=64), nullable=False),
        sa.Column('role', sa.String(length=16), nullable=False),
        sa.Column('created_by', sa.String(length=80), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('kind', 'value', name='uq_wecom_role_mappings_kind_value'),
    )


def downgrade() -> None:
    op.drop_table('wecom_role_mappings')
