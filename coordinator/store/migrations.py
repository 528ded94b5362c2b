"""Columns added to existing tables after a database was first created.

``metadata.create_all`` makes missing tables but never changes one that exists, so a database
made by an older version lacks the newer columns. Each is added here, at open, with its server
default (so existing rows get a value), on SQLite and PostgreSQL alike. Only additive, nullable
or defaulted columns belong here; anything else needs a real migration tool.
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import api_keys, node_tokens, tasks

log = logging.getLogger(__name__)

#: (table, column name) of every column added after its table first shipped, oldest first.
ADDED_COLUMNS: tuple[tuple[sa.Table, str], ...] = (
    (api_keys, "is_admin"),
    (tasks, "prompt_tokens"),
    (tasks, "completion_tokens"),
    # key and node lifecycle
    (api_keys, "expires_at"),
    (api_keys, "revoked_at"),
    (api_keys, "last_used_at"),
    (api_keys, "rotated_at"),
    (node_tokens, "revoked_at"),
    (node_tokens, "last_seen_at"),
    (node_tokens, "online_instance_id"),
    # the fair admission queue
    (api_keys, "priority"),
)


def add_missing_columns(conn: Connection) -> list[str]:
    """Add the columns of ``ADDED_COLUMNS`` a table lacks; returns ``table.column`` of each added.

    Runs inside the table-creation transaction (under its advisory lock on PostgreSQL). A
    concurrent opener that added the column first makes the ALTER fail with "duplicate column";
    ``create_tables`` retries, and the retry finds the column in place.
    """
    inspector = sa.inspect(conn)
    added = []
    for table, name in ADDED_COLUMNS:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        if name in present:
            continue
        conn.execute(sa.text(_add_column_sql(conn, table.c[name])))
        added.append(f"{table.name}.{name}")
        log.info("added the column %s.%s to an existing database", table.name, name)
    return added


def _add_column_sql(conn: Connection, column: sa.Column[object]) -> str:
    dialect = conn.dialect
    preparer = dialect.identifier_preparer
    column_type = column.type.compile(dialect=dialect)
    sql = (
        f"ALTER TABLE {preparer.format_table(column.table)} "
        f"ADD COLUMN {preparer.format_column(column)} {column_type}"
    )
    default = column.server_default
    if isinstance(default, sa.DefaultClause) and not isinstance(default.arg, str):
        # The same literal the table's own DDL uses (SQLite: 0, PostgreSQL: false).
        sql += f" DEFAULT {default.arg.compile(dialect=dialect)}"
    if not column.nullable:
        sql += " NOT NULL"
    return sql
