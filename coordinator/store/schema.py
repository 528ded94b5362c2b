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
# Key lifecycle (``keys/lifecycle.py``), added after the first release: NULL means never / none.
api_keys.append_column(sa.Column("expires_at", sa.Float, nullable=True))
api_keys.append_column(sa.Column("revoked_at", sa.Float, nullable=True))
# Written in batches off the request path (``keys/last_used.py``): up to a minute behind.
api_keys.append_column(sa.Column("last_used_at", sa.Float, nullable=True))
api_keys.append_column(sa.Column("rotated_at", sa.Float, nullable=True))

node_tokens = sa.Table(
    "node_tokens",
    metadata,
    sa.Column("node_id", sa.String(255), primary_key=True),
    # SHA-256 hex digest of the current token; re-enrolling overwrites it.
    sa.Column("token_hash", sa.String(64), nullable=False),
    sa.Column("enrolled_at", sa.Float, nullable=False),
)
# Node lifecycle, added after the first release. A revoked node's token is refused; enrolling
# it again clears ``revoked_at``. ``online_instance_id`` is the instance holding its socket as
# last written (cleared when it leaves); ``last_seen_at`` is refreshed about once a minute.
node_tokens.append_column(sa.Column("revoked_at", sa.Float, nullable=True))
node_tokens.append_column(sa.Column("last_seen_at", sa.Float, nullable=True))
node_tokens.append_column(sa.Column("online_instance_id", sa.String(255), nullable=True))

#: Who changed which key or node, and when (the CLI: the OS user; the admin API: its key id).
admin_log = sa.Table(
    "admin_log",
    metadata,
    sa.Column("event_id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("actor", sa.String(255), nullable=False),
    # key.create, key.revoke, key.rotate, node.enroll, node.revoke
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("subject", sa.String(255), nullable=False),
    sa.Index("ix_admin_log_subject", "subject"),
)

#: One row: a counter every revocation (and rotation) bumps in its own transaction. Each
#: instance reads it about twice a second and drops its cached authentications when it moved.
revocation_epoch = sa.Table(
    "revocation_epoch",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
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
