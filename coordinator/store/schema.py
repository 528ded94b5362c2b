"""The store's tables, in SQLAlchemy Core, portable across SQLite and PostgreSQL.

Indexes follow the queries: API keys are looked up by hash (unique), node tokens and tasks and
ratings by primary key; ``node_ratings`` joins ratings to tasks on the task primary key and
groups by ``tasks.node_id``; ``tasks(key_id, created_at)`` serves per-key history and usage
(``Store.usage`` for one key), ``tasks(created_at)`` retention sweeps and usage over every key.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False),
    # SHA-256 hex digest of the key; the plaintext is never stored.
    sa.Column("key_hash", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    # An operator key (``gemmanet keys create --admin``): sees node details on /system-health.
    # Added after the first release: ``migrations.add_missing_columns`` adds it to older files.
    sa.Column("is_admin", sa.Boolean, nullable=False, server_default=sa.false()),
    # The key's weight in the fair admission queue, 1-100 (``gemmanet keys create --priority``;
    # added after the first release, like is_admin).
    sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("1")),
    sa.Index("ux_api_keys_key_hash", "key_hash", unique=True),
)

node_tokens = sa.Table(
    "node_tokens",
    metadata,
    sa.Column("node_id", sa.String(255), primary_key=True),
    # SHA-256 hex digest of the current token; re-enrolling overwrites it.
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("enrolled_at", sa.Float, nullable=False),
)

tasks = sa.Table(
    "tasks",
    metadata,
    sa.Column("task_id", sa.String(255), primary_key=True),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("node_id", sa.String(255), nullable=True),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("error_code", sa.String(128), nullable=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("finished_at", sa.Float, nullable=False),
    sa.Column("latency_ms", sa.Float, nullable=False),
    sa.Column("stream", sa.Boolean, nullable=False),
    sa.Column("instance_id", sa.String(255), nullable=False),
    # Tokens as the node's model server counted them; NULL when it did not say (a failed task,
    # an older node). BIGINT: the protocol allows counts up to 2**53 - 1, past PostgreSQL's
    # INTEGER, and one out-of-range value would fail its whole batch of records.
    # Added after the first release: ``migrations.add_missing_columns`` adds them.
    sa.Column("prompt_tokens", sa.BigInteger, nullable=True),
    sa.Column("completion_tokens", sa.BigInteger, nullable=True),
    sa.Index("ix_tasks_node_id", "node_id"),
    sa.Index("ix_tasks_key_id_created_at", "key_id", "created_at"),
    sa.Index("ix_tasks_created_at", "created_at"),
)

ratings = sa.Table(
    "ratings",
    metadata,
    # The primary key is what makes "rated at most once" atomic across processes.
    sa.Column(
        "task_id",
        sa.String(255),
        sa.ForeignKey("tasks.task_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("score", sa.Integer, nullable=False),
    sa.Column("rated_at", sa.Float, nullable=False),
    sa.CheckConstraint("score BETWEEN 1 AND 5", name="ck_ratings_score"),
)
