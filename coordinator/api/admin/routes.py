"""The admin API: API keys and enrolled nodes, for operator keys only (``keys create --admin``).

    GET  /api/v1/admin/keys                      every key (never a secret)
    POST /api/v1/admin/keys                      a new key; its secret in the answer, once (201)
    POST /api/v1/admin/keys/{key_id}/revoke      refused everywhere within 1 s
    POST /api/v1/admin/keys/{key_id}/rotate      a new secret; the old one refused within 1 s
    GET  /api/v1/admin/nodes                     every enrolled node, online where
    POST /api/v1/admin/nodes/{node_id}/revoke    its socket closed with 4001 within 1 s

Every change goes to the store's change log as made by ``api:<the admin key's id>``. After a
change the answering instance reads the revocation epoch before it answers (its cache is
emptied, its nodes checked at once); the others read it within half a second
(``store/keys/auth.py``).
"""

from __future__ import annotations

import logging
import time

from quart import Quart, Response
from quart_schema import document_request, document_response, security_scheme

from coordinator.api.admin.schemas import (
    AdminKey,
    AdminKeyResponse,
    AdminKeysResponse,
    AdminNode,
    AdminNodeResponse,
    AdminNodesResponse,
    AdminSecretResponse,
    CreateKeyRequest,
)
from coordinator.api.responses import json_response
from coordinator.api.routes import (
    _BEARER,
    _errors,
    authenticate,
    decode_body,
    instance,
    read_raw_body,
)
from coordinator.errors import Forbidden, InvalidFields, StoreError
from coordinator.runtime.instance import Instance
from coordinator.store import ApiKey, check_key_name, parse_duration

log = logging.getLogger("gemmanet.admin")


async def authenticate_admin() -> ApiKey:
    api_key = await authenticate()
    if not api_key.admin:
        raise Forbidden("the admin API needs an operator key (gemmanet keys create --admin)")
    return api_key


def actor(api_key: ApiKey) -> str:
    return f"api:{api_key.key_id}"


async def honour_now(inst: Instance) -> None:
    """Read the revocation epoch now: this instance drops its cache before answering and
    checks its nodes at once (the watch would within half a second anyway)."""
    try:
        await inst.store.auth.check(fresh=True)
    except StoreError as exc:
        log.warning("could not read the revocation epoch after a change: %s", exc)


def online_nodes(inst: Instance) -> dict[str, str]:
    """node id -> the instance holding its socket, from the live cluster view."""
    return {v.node_id: v.instance_id for v in inst.machine.views()}


def register_admin_routes(app: Quart) -> None:
    @app.get("/api/v1/admin/keys")
    @security_scheme(_BEARER)
    @document_response(AdminKeysResponse)
    @_errors(401, 403, 503)
    async def admin_keys() -> Response:
        """Every API key: id, name, admin, created, last used, expiry, revocation, state."""
        await authenticate_admin()
        store = instance().store
        keys = await store.run_sync(store.lifecycle.list_keys)
        now = time.time()
        return json_response(AdminKeysResponse(keys=[AdminKey.of(k, now) for k in keys]))

    @app.post("/api/v1/admin/keys")
    @security_scheme(_BEARER)
    @document_request(CreateKeyRequest)
    @document_response(AdminSecretResponse, 201)
    @_errors(400, 401, 403, 413, 422, 503)
    async def admin_create_key() -> Response:
        """Create an API key (`expires`: a lifetime such as `30d`); the answer holds its secret,
        which is shown only this once."""
        data = await read_raw_body()
        api_key = await authenticate_admin()
        body = decode_body(data, CreateKeyRequest)
        try:
            check_key_name(body.name)
            lifetime = None if body.expires is None else parse_duration(body.expires)
        except ValueError as exc:
            raise InvalidFields(f"invalid request: {exc}") from None
        store = instance().store
        now = time.time()
        expires_at = None if lifetime is None else now + lifetime

        def create() -> tuple[ApiKey, str]:
            return store.create_api_key_sync(
                body.name, admin=body.admin, expires_at=expires_at, actor=actor(api_key)
            )

        record, secret = await store.run_sync(create)
        info = await store.run_sync(store.lifecycle.get_key, record.key_id)
        return json_response(AdminSecretResponse(key=AdminKey.of(info, now), secret=secret), 201)

    @app.post("/api/v1/admin/keys/<key_id>/revoke")
    @security_scheme(_BEARER)
    @document_response(AdminKeyResponse)
    @_errors(401, 403, 404, 503)
    async def admin_revoke_key(key_id: str) -> Response:
        """Revoke a key: every instance refuses it within 1 s. Revoking it again is no error."""
        await read_raw_body()
        api_key = await authenticate_admin()
        inst = instance()
        store = inst.store
        info = await store.run_sync(
            lambda: store.lifecycle.revoke_key(key_id, actor=actor(api_key))
        )
        await honour_now(inst)
        return json_response(AdminKeyResponse(key=AdminKey.of(info, time.time())))

    @app.post("/api/v1/admin/keys/<key_id>/rotate")
    @security_scheme(_BEARER)
    @document_response(AdminSecretResponse)
    @_errors(401, 403, 404, 409, 503)
    async def admin_rotate_key(key_id: str) -> Response:
        """A new secret for the same key (id, name, limits, expiry kept), shown only this
        once; the old secret is refused everywhere within 1 s. 409 `key_revoked` for a
        revoked key."""
        await read_raw_body()
        api_key = await authenticate_admin()
        inst = instance()
        store = inst.store
        info, secret = await store.run_sync(
            lambda: store.lifecycle.rotate_key(key_id, actor=actor(api_key))
        )
        await honour_now(inst)
        return json_response(AdminSecretResponse(key=AdminKey.of(info, time.time()), secret=secret))

    @app.get("/api/v1/admin/nodes")
    @security_scheme(_BEARER)
    @document_response(AdminNodesResponse)
    @_errors(401, 403, 503)
    async def admin_nodes() -> Response:
        """Every enrolled node: enrolled, last seen, the instance holding it now, revocation."""
        await authenticate_admin()
        inst = instance()
        records = await inst.store.run_sync(inst.store.lifecycle.list_nodes)
        online = online_nodes(inst)
        nodes = [AdminNode.of(r, online.get(r.node_id)) for r in records]
        return json_response(AdminNodesResponse(nodes=nodes))

    @app.post("/api/v1/admin/nodes/<node_id>/revoke")
    @security_scheme(_BEARER)
    @document_response(AdminNodeResponse)
    @_errors(401, 403, 404, 503)
    async def admin_revoke_node(node_id: str) -> Response:
        """Revoke a node: its socket, on whichever instance holds it, is closed with 4001
        within 1 s, and its token is refused until it is enrolled again."""
        await read_raw_body()
        api_key = await authenticate_admin()
        inst = instance()
        store = inst.store
        record = await store.run_sync(
            lambda: store.lifecycle.revoke_node(node_id, actor=actor(api_key))
        )
        await honour_now(inst)
        online = online_nodes(inst).get(node_id)
        return json_response(AdminNodeResponse(node=AdminNode.of(record, online)))
