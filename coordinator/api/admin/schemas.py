"""The bodies of the admin routes (``routes.py``): API keys and enrolled nodes as an
operator sees them, never a stored secret (a new one is shown once, in ``secret``)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from coordinator.api.schemas import _Response
from coordinator.store import KeyInfo, NodeRecord

UnixTime = Annotated[float, msgspec.Meta(description="Unix seconds")]
KeyState = Annotated[str, msgspec.Meta(description="active, expired or revoked")]
NodeState = Annotated[str, msgspec.Meta(description="online, offline or revoked")]


class CreateKeyRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A new API key: its label, whether it is an operator key, and an optional lifetime."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
    admin: bool = False
    expires: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64, description="a lifetime such as 30d, 12h, 90m, 2w (default: never)"
            ),
        ]
        | None
    ) = None


class AdminKey(_Response, kw_only=True):
    """One API key (``gemmanet keys list`` shows the same fields)."""

    key_id: str
    name: str
    admin: bool
    created_at: UnixTime
    last_used_at: Annotated[
        UnixTime | None,
        msgspec.Meta(description="newest use any instance wrote; up to about a minute behind"),
    ]
    expires_at: UnixTime | None
    revoked_at: UnixTime | None
    state: KeyState

    @classmethod
    def of(cls, info: KeyInfo, now: float) -> AdminKey:
        return cls(
            key_id=info.key_id,
            name=info.name,
            admin=info.admin,
            created_at=info.created_at,
            last_used_at=info.last_used_at,
            expires_at=info.expires_at,
            revoked_at=info.revoked_at,
            state=info.state(now),
        )


class AdminKeysResponse(_Response, kw_only=True):
    keys: list[AdminKey]


class AdminKeyResponse(_Response, kw_only=True):
    key: AdminKey


class AdminSecretResponse(_Response, kw_only=True):
    """A key and its new secret, shown only this once (creation, rotation)."""

    key: AdminKey
    secret: str


class AdminNode(_Response, kw_only=True):
    """One enrolled node identity (``gemmanet nodes list`` shows the same fields)."""

    node_id: str
    enrolled_at: UnixTime
    last_seen_at: Annotated[
        UnixTime | None,
        msgspec.Meta(description="when an instance last wrote that it holds the node's socket"),
    ]
    online_on: Annotated[
        str | None, msgspec.Meta(description="the instance holding its socket now (null: none)")
    ]
    revoked_at: UnixTime | None
    state: NodeState

    @classmethod
    def of(cls, record: NodeRecord, online_on: str | None) -> AdminNode:
        if record.revoked_at is not None:
            state = "revoked"
        else:
            state = "online" if online_on else "offline"
        return cls(
            node_id=record.node_id,
            enrolled_at=record.enrolled_at,
            last_seen_at=record.last_seen_at,
            online_on=online_on,
            revoked_at=record.revoked_at,
            state=state,
        )


class AdminNodesResponse(_Response, kw_only=True):
    nodes: list[AdminNode]


class AdminNodeResponse(_Response, kw_only=True):
    node: AdminNode
