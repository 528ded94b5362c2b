"""Key and node lifecycle in the store: listing, revoking, rotating, the change log, the
revocation epoch, and the batched "last used" / "last seen" writes.

Every change is one transaction that also appends its row to ``admin_log`` (who, what, when)
and, when it takes a secret's power away (a revocation, a rotation), bumps the one-row
``revocation_epoch`` counter. Instances read that counter about twice a second
(``auth.CachedAuth``) and drop their cached authentications when it moved, so a revocation
made by any process (the CLI, another instance) is honoured everywhere within a second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..errors import KeyRevoked, NodeNotEnrolled, UnknownKey
from ..records import KeyInfo, NodeRecord
from ..schema import admin_log, api_keys, node_tokens, revocation_epoch
from ..translate import translate_errors
from . import tokens

log = logging.getLogger(__name__)

_EPOCH_ROW = 1
MAX_ACTOR_LENGTH = 255


def log_change(conn: Connection, at: float, actor: str | None, action: str, subject: str) -> None:
    """Append one row to ``admin_log`` (inside the change's own transaction) and log it."""
    who = (actor or "unknown")[:MAX_ACTOR_LENGTH]
    conn.execute(admin_log.insert().values(at=at, actor=who, action=action, subject=subject))
    log.info("%s %s by %s", action, subject, who)


def ensure_epoch_row(conn: Connection) -> None:
    """Create the revocation epoch's one row if it is missing (at open, under the schema lock
    on PostgreSQL; a concurrent opener's duplicate is retried by ``create_tables``)."""
    present = conn.execute(
        sa.select(revocation_epoch.c.id).where(revocation_epoch.c.id == _EPOCH_ROW)
    ).first()
    if present is None:
        conn.execute(revocation_epoch.insert().values(id=_EPOCH_ROW, epoch=0))


def bump_epoch(conn: Connection) -> None:
    """Move the revocation epoch on, in the caller's transaction (the row lock orders bumps)."""
    moved = conn.execute(
        revocation_epoch.update()
        .where(revocation_epoch.c.id == _EPOCH_ROW)
        .values(epoch=revocation_epoch.c.epoch + 1)
    ).rowcount
    if not moved:  # the row is made at open (``ensure_epoch_row``); a database emptied since
        conn.execute(revocation_epoch.insert().values(id=_EPOCH_ROW, epoch=1))


class Lifecycle:
    """The synchronous lifecycle operations on one engine (``Store`` runs them in threads)."""

    def __init__(self, engine: Engine, wall_clock: Callable[[], float]) -> None:
        self._engine = engine
        self._wall_clock = wall_clock

    # ------------------------------------------------------------------ reading

    @translate_errors
    def read_epoch(self) -> int:
        with self._engine.connect() as conn:
            value = conn.execute(
                sa.select(revocation_epoch.c.epoch).where(revocation_epoch.c.id == _EPOCH_ROW)
            ).scalar_one_or_none()
        return int(value or 0)

    @translate_errors
    def list_keys(self) -> list[KeyInfo]:
        c = api_keys.c
        query = sa.select(
            c.key_id, c.name, c.is_admin, c.created_at, c.last_used_at, c.expires_at, c.revoked_at
        ).order_by(c.created_at, c.key_id)
        with self._engine.connect() as conn:
            return [_key_info(row) for row in conn.execute(query)]

    @translate_errors
    def get_key(self, key_id: str) -> KeyInfo:
        c = api_keys.c
        query = sa.select(
            c.key_id, c.name, c.is_admin, c.created_at, c.last_used_at, c.expires_at, c.revoked_at
        ).where(c.key_id == key_id)
        with self._engine.connect() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise UnknownKey(f"no API key with id {key_id!r}")
        return _key_info(row)

    @translate_errors
    def list_nodes(self) -> list[NodeRecord]:
        c = node_tokens.c
        query = sa.select(
            c.node_id, c.enrolled_at, c.last_seen_at, c.online_instance_id, c.revoked_at
        ).order_by(c.node_id)
        with self._engine.connect() as conn:
            return [NodeRecord(*row) for row in conn.execute(query)]

    @translate_errors
    def revoked_nodes(self, node_ids: Iterable[str]) -> set[str]:
        """Of ``node_ids``, the ones revoked or no longer enrolled at all."""
        wanted = set(node_ids)
        if not wanted:
            return set()
        c = node_tokens.c
        with self._engine.connect() as conn:
            valid = {
                row.node_id
                for row in conn.execute(
                    sa.select(c.node_id).where(c.node_id.in_(wanted), c.revoked_at.is_(None))
                )
            }
        return wanted - valid

    # ------------------------------------------------------------------ changes

    @translate_errors
    def revoke_key(self, key_id: str, *, actor: str | None) -> KeyInfo:
        """Revoke the key (at once on this instance, within a second everywhere). Revoking a
        revoked key changes nothing and is not an error."""
        now = self._wall_clock()
        with self._engine.begin() as conn:
            updated = conn.execute(
                api_keys.update()
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=now)
            ).rowcount
            if updated:
                bump_epoch(conn)
                log_change(conn, now, actor, "key.revoke", key_id)
        return self.get_key(key_id)

    @translate_errors
    def rotate_key(self, key_id: str, *, actor: str | None) -> tuple[KeyInfo, str]:
        """A new secret for the same key (id, name, limits, expiry); the old one stops working.
        Returns the key and the new plaintext, shown only once."""
        plaintext = tokens.new_api_key()
        now = self._wall_clock()
        with self._engine.begin() as conn:
            revoked = conn.execute(
                sa.select(api_keys.c.revoked_at).where(api_keys.c.key_id == key_id)
            ).first()
            if revoked is None:
                raise UnknownKey(f"no API key with id {key_id!r}")
            if revoked.revoked_at is not None:
                raise KeyRevoked(f"API key {key_id} is revoked; create a new key instead")
            conn.execute(
                api_keys.update()
                .where(api_keys.c.key_id == key_id)
                .values(key_hash=tokens.digest(plaintext), rotated_at=now)
            )
            bump_epoch(conn)
            log_change(conn, now, actor, "key.rotate", key_id)
        return self.get_key(key_id), plaintext

    @translate_errors
    def revoke_node(self, node_id: str, *, actor: str | None) -> NodeRecord:
        """Refuse the node's token from now on; its live connection, on whichever instance
        holds it, is closed with 4001 within a second. Enrolling it again lifts this."""
        now = self._wall_clock()
        with self._engine.begin() as conn:
            exists = conn.execute(
                sa.select(node_tokens.c.revoked_at).where(node_tokens.c.node_id == node_id)
            ).first()
            if exists is None:
                raise NodeNotEnrolled(f"no node enrolled with id {node_id!r}")
            if exists.revoked_at is None:
                conn.execute(
                    node_tokens.update()
                    .where(node_tokens.c.node_id == node_id)
                    .values(revoked_at=now)
                )
                bump_epoch(conn)
                log_change(conn, now, actor, "node.revoke", node_id)
        (record,) = self.list_nodes_by_id([node_id])
        return record

    @translate_errors
    def list_nodes_by_id(self, node_ids: Iterable[str]) -> list[NodeRecord]:
        c = node_tokens.c
        query = sa.select(
            c.node_id, c.enrolled_at, c.last_seen_at, c.online_instance_id, c.revoked_at
        ).where(c.node_id.in_(list(node_ids)))
        with self._engine.connect() as conn:
            return [NodeRecord(*row) for row in conn.execute(query)]

    # ------------------------------------------------------------------ batched writes

    @translate_errors
    def write_last_used(self, used: Mapping[str, float]) -> None:
        """Record the newest use of each key (one transaction for the batch; a time older
        than the stored one, from a slower instance, never moves it back)."""
        if not used:
            return
        c = api_keys.c
        statement = (
            api_keys.update()
            .where(c.key_id == sa.bindparam("b_key_id"))
            .where(sa.or_(c.last_used_at.is_(None), c.last_used_at < sa.bindparam("b_at")))
            .values(last_used_at=sa.bindparam("b_at"))
        )
        rows = [{"b_key_id": k, "b_at": at} for k, at in sorted(used.items())]
        with self._engine.begin() as conn:
            conn.execute(statement, rows)

    @translate_errors
    def write_nodes_seen(self, instance_id: str, node_ids: Iterable[str], at: float) -> None:
        """The nodes whose sockets ``instance_id`` holds, seen at ``at``."""
        wanted = sorted(set(node_ids))
        if not wanted:
            return
        with self._engine.begin() as conn:
            conn.execute(
                node_tokens.update()
                .where(node_tokens.c.node_id.in_(wanted))
                .values(last_seen_at=at, online_instance_id=instance_id)
            )

    @translate_errors
    def write_nodes_gone(self, instance_id: str, node_ids: Iterable[str], at: float) -> None:
        """The nodes' sockets on ``instance_id`` closed (a newer one elsewhere is left alone)."""
        wanted = sorted(set(node_ids))
        if not wanted:
            return
        c = node_tokens.c
        with self._engine.begin() as conn:
            conn.execute(
                node_tokens.update()
                .where(c.node_id.in_(wanted), c.online_instance_id == instance_id)
                .values(last_seen_at=at, online_instance_id=None)
            )


def _key_info(row: Any) -> KeyInfo:
    return KeyInfo(
        key_id=row.key_id,
        name=row.name,
        admin=bool(row.is_admin),
        created_at=row.created_at,
        last_used_at=row.last_used_at,
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
    )
