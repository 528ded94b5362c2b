"""``gemmanet keys list|revoke|rotate`` and ``gemmanet nodes list|revoke`` (``keys create`` and
``nodes enroll`` live in cli.py). Standard library only at module level, like cli_help: the
store is imported by the handlers, so ``gemmanet --help`` still loads nothing of it.

Every change is written to the store's change log with the OS user who ran the command.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from coordinator.store import KeyInfo, NodeRecord, Store

Fail = Callable[[str, int], int]

#: what a key's or node's JSON row has, in order (the admin API's rows have the same fields)
KEY_FIELDS = (
    "key_id",
    "name",
    "admin",
    "created_at",
    "last_used_at",
    "expires_at",
    "revoked_at",
    "state",
)
NODE_FIELDS = ("node_id", "enrolled_at", "last_seen_at", "online_on", "revoked_at", "state")


def cli_actor() -> str:
    """Who ran the command, for the change log: ``cli:<OS user>``."""
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):  # no user name for this uid (a bare container)
        return f"cli:uid-{os.getuid()}"


def when(at: float | None, none: str = "-") -> str:
    """Unix seconds as UTC ``2026-12-03 06:40:00Z`` (``none`` for no time)."""
    if at is None:
        return none
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at))


def key_row(info: KeyInfo, now: float) -> dict[str, Any]:
    return {
        "key_id": info.key_id,
        "name": info.name,
        "admin": info.admin,
        "created_at": info.created_at,
        "last_used_at": info.last_used_at,
        "expires_at": info.expires_at,
        "revoked_at": info.revoked_at,
        "state": info.state(now),
    }


def node_row(record: NodeRecord, now: float) -> dict[str, Any]:
    from coordinator.store import online_on

    online = online_on(record.online_instance_id, record.last_seen_at, now)
    state = "revoked" if record.revoked_at is not None else "online" if online else "offline"
    return {
        "node_id": record.node_id,
        "enrolled_at": record.enrolled_at,
        "last_seen_at": record.last_seen_at,
        "online_on": online,
        "revoked_at": record.revoked_at,
        "state": state,
    }


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    head = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    return "\n".join(line.rstrip() for line in [head, *lines])


@contextmanager
def opened_store() -> Iterator[Store]:
    from coordinator.settings import Settings
    from coordinator.store import Store

    store = Store.open(Settings.from_env().database_url)
    try:
        yield store
    finally:
        store.close()


def keys_list(args: argparse.Namespace) -> int:
    with opened_store() as store:
        keys = store.lifecycle.list_keys()
    now = time.time()
    rows = [key_row(k, now) for k in keys]
    if args.json:
        print(json.dumps({"keys": rows}))
        return 0
    headers = ["ID", "NAME", "ADMIN", "CREATED", "LAST USED", "EXPIRES", "REVOKED", "STATE"]
    print(
        table(
            headers,
            [
                [
                    r["key_id"],
                    r["name"],
                    "yes" if r["admin"] else "no",
                    when(r["created_at"]),
                    when(r["last_used_at"], "never"),
                    when(r["expires_at"], "never"),
                    when(r["revoked_at"]),
                    r["state"],
                ]
                for r in rows
            ],
        )
    )
    return 0


def keys_create(args: argparse.Namespace, fail: Fail) -> int:
    from coordinator.settings import Settings
    from coordinator.store import Store, check_key_name, parse_duration
    from coordinator.store.records import check_priority

    for flag, check, value in [
        ("--name", check_key_name, args.name),
        ("--priority", check_priority, args.priority),
    ]:
        try:
            check(value)
        except ValueError as exc:
            return fail(f"{flag}: {exc}", 2)
    try:
        expires_at = None if args.expires is None else time.time() + parse_duration(args.expires)
    except ValueError as exc:
        return fail(f"--expires: {exc}", 2)
    store = Store.open(Settings.from_env().database_url)
    try:
        record, key = store.create_api_key_sync(
            args.name,
            admin=args.admin,
            priority=args.priority,
            expires_at=expires_at,
            actor=cli_actor(),
        )
    finally:
        store.close()
    kind = "operator (admin) API key" if record.admin else "API key"
    expiry = "" if expires_at is None else f", expiring {when(expires_at)}"
    print(f"created {kind} {record.key_id} named {record.name!r}{expiry}; shown only once:")
    print(key)
    return 0


def keys_revoke(args: argparse.Namespace, fail: Fail) -> int:
    from coordinator.store import UnknownKey

    with opened_store() as store:
        before = time.time()
        try:
            info = store.lifecycle.revoke_key(args.key_id, actor=cli_actor())
        except UnknownKey as exc:
            return fail(str(exc), 1)
    if info.revoked_at is not None and info.revoked_at < before:
        print(
            f"API key {info.key_id} ({info.name!r}) was already revoked at {when(info.revoked_at)}"
        )
    else:
        print(
            f"revoked API key {info.key_id} ({info.name!r}); every instance refuses it within 1 s"
        )
    return 0


def keys_rotate(args: argparse.Namespace, fail: Fail) -> int:
    from coordinator.store import KeyRevoked, UnknownKey

    with opened_store() as store:
        try:
            info, key = store.lifecycle.rotate_key(args.key_id, actor=cli_actor())
        except (UnknownKey, KeyRevoked) as exc:
            return fail(str(exc), 1)
    print(
        f"rotated API key {info.key_id} ({info.name!r}); the old secret is refused within 1 s. "
        "The new key, shown only once:"
    )
    print(key)
    return 0


def nodes_list(args: argparse.Namespace) -> int:
    with opened_store() as store:
        nodes = store.lifecycle.list_nodes()
    now = time.time()
    rows = [node_row(n, now) for n in nodes]
    if args.json:
        print(json.dumps({"nodes": rows}))
        return 0
    headers = ["ID", "ENROLLED", "LAST SEEN", "ONLINE ON", "REVOKED", "STATE"]
    print(
        table(
            headers,
            [
                [
                    r["node_id"],
                    when(r["enrolled_at"]),
                    when(r["last_seen_at"], "never"),
                    r["online_on"] or "-",
                    when(r["revoked_at"]),
                    r["state"],
                ]
                for r in rows
            ],
        )
    )
    return 0


def nodes_revoke(args: argparse.Namespace, fail: Fail) -> int:
    from coordinator.store import NodeNotEnrolled, check_node_id

    try:
        check_node_id(args.node_id)
    except ValueError as exc:
        return fail(f"NODE_ID: {exc}", 2)
    with opened_store() as store:
        try:
            record = store.lifecycle.revoke_node(args.node_id, actor=cli_actor())
        except NodeNotEnrolled as exc:
            return fail(str(exc), 1)
    print(
        f"revoked node {record.node_id} (at {when(record.revoked_at)}); its connection is closed "
        "with 4001 within 1 s and it cannot reconnect until enrolled again"
    )
    return 0


def add_lifecycle_commands(
    keys: argparse._SubParsersAction[argparse.ArgumentParser],
    nodes: argparse._SubParsersAction[argparse.ArgumentParser],
    fail: Fail,
    epilog: Callable[[Any], None],
) -> None:
    """The list/revoke/rotate actions, beside ``keys create`` and ``nodes enroll``.
    ``epilog(parser)`` lists the settings an action reads under its --help."""
    listing = keys.add_parser(
        "list", help="every API key: id, name, admin, created, last used, expires, revoked"
    )
    listing.add_argument("--json", action="store_true", help='print {"keys": [...]} (Unix times)')
    listing.set_defaults(handler=keys_list)
    revoke = keys.add_parser("revoke", help="revoke a key: every instance refuses it within 1 s")
    revoke.add_argument("key_id", metavar="ID", help="the key's id (key_..., from keys list)")
    revoke.set_defaults(handler=lambda args: keys_revoke(args, fail))
    rotate = keys.add_parser(
        "rotate",
        help="a new secret for the same key id (name, limits, expiry kept); the old one is "
        "refused within 1 s; prints the new key on the last line",
    )
    rotate.add_argument("key_id", metavar="ID", help="the key's id (key_..., from keys list)")
    rotate.set_defaults(handler=lambda args: keys_rotate(args, fail))
    node_listing = nodes.add_parser(
        "list", help="every enrolled node: id, enrolled, last seen, online on which instance"
    )
    node_listing.add_argument(
        "--json", action="store_true", help='print {"nodes": [...]} (Unix times)'
    )
    node_listing.set_defaults(handler=nodes_list)
    node_revoke = nodes.add_parser(
        "revoke", help="revoke a node: its socket is closed with 4001 within 1 s, on any instance"
    )
    node_revoke.add_argument("node_id", metavar="NODE_ID", help="the node identity")
    node_revoke.set_defaults(handler=lambda args: nodes_revoke(args, fail))
    for parser in (listing, revoke, rotate, node_listing, node_revoke):
        epilog(parser)
