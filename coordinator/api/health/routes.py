"""The System Health page: ``GET /system-health`` (HTML, its script and stylesheet) and the JSON
it polls, ``GET /api/v1/cluster``.

No build step and no third-party asset: the files in ``page/`` ship with the
package and are served from here, under a Content-Security-Policy that allows this origin only
(so a CDN script could not load even if one were added by mistake). The page itself needs no
key; it asks for one and sends it with every poll. Node details, and the queue per model
(which names the models), go to operator keys only.
"""

from __future__ import annotations

import html
import time
from functools import cache
from importlib import resources

import msgspec
from quart import Quart, Response
from quart_schema import document_response, hide, security_scheme

from coordinator import __version__
from coordinator.api.health.schemas import (
    AffinityInfo,
    ClusterResponse,
    HostPlacementInfo,
    InstanceLiveness,
    MonitorInfo,
    PlacementSwitchInfo,
    QueueWaitInfo,
)
from coordinator.api.responses import error_response, json_response
from coordinator.api.routes import _BEARER, _errors, authenticate, instance
from coordinator.api.schemas import NodeInfo
from coordinator.coordination import CoordinationUnavailable, MonitorStore
from coordinator.runtime import instance_status
from coordinator.runtime.instance import Instance
from coordinator.runtime.metrics import PRIORITY_CLASSES

PAGE_PATH = "/system-health"
# name -> content type; nothing else under page/ is served.
ASSETS = {
    "health.js": "text/javascript",
    "health.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> str:
    return (resources.files("coordinator.api.health") / "page" / name).read_text("utf-8")


def render_page(instance_id: str) -> str:
    """The page with what the server knows without a key filled in (escaped)."""
    return (
        _asset("index.html")
        .replace("{{instance_id}}", html.escape(instance_id))
        .replace("{{version}}", html.escape(__version__))
    )


def register_system_health(app: Quart) -> None:
    @app.get(PAGE_PATH)
    @hide
    async def system_health_page() -> Response:
        return Response(
            render_page(instance().instance_id),
            200,
            _PAGE_HEADERS,
            content_type="text/html; charset=utf-8",
        )

    @app.get(f"{PAGE_PATH}/<name>")
    @hide
    async def system_health_asset(name: str) -> Response:
        content_type = ASSETS.get(name)
        if content_type is None:
            return error_response(404, "not_found", "no such file of the System Health page")
        return Response(
            _asset(name), 200, _PAGE_HEADERS, content_type=f"{content_type}; charset=utf-8"
        )

    @app.get("/api/v1/cluster")
    @security_scheme(_BEARER)
    @document_response(ClusterResponse)
    @_errors(401, 503)
    async def cluster() -> Response:
        """What the System Health page shows: instances with their liveness, aggregate counts,
        the elected monitor (null when none holds the lease) and, for an operator key only,
        every node and the queue per model (any other key: `nodes` and `queued` null)."""
        api_key = await authenticate()
        inst = instance()
        status = await instance_status.cluster_status(inst)
        queued = msgspec.convert(status["queued"], dict[str, int] | None)
        queue_depth = None if queued is None else sum(queued.values())
        nodes = None
        if api_key.admin:
            nodes = msgspec.convert(await instance_status.cluster_nodes(inst), list[NodeInfo])
        else:
            # The per-model queue names every model the fleet serves: operators only. Any
            # other key gets the total.
            queued = None
        members = [
            InstanceLiveness(
                instance_id=m.instance_id,
                state=m.state,
                answering=m.instance_id == inst.instance_id,
                last_beat_age_s=round(m.last_beat_age_s, 3),
                nodes=m.nodes,
                in_flight=m.in_flight,
            )
            for m in inst.membership.members()
        ]
        body = ClusterResponse(
            instance_id=inst.instance_id,
            version=__version__,
            generated_at=time.time(),
            admin=api_key.admin,
            instances=members,
            online_nodes=msgspec.convert(status["online_nodes"], int),
            in_flight=msgspec.convert(status["in_flight"], int),
            queued=queued,
            queue_depth=queue_depth,
            monitor=await _monitor(inst.coordination.monitor),
            nodes=nodes,
            affinity=msgspec.convert(inst.affinity.status(), AffinityInfo),
            queue_waits=_queue_waits(inst.admissions.waited_by_priority),
            host_placement=_host_placement(inst),
        )
        return json_response(body)


def _host_placement(inst: Instance) -> HostPlacementInfo:
    hosts, switch = inst.machine.hosts, inst.host_facts.switch
    return HostPlacementInfo(
        mode=hosts.placement,
        placing=hosts.placing and bool(hosts),
        hosts=len(hosts.terms),
        switch=None if switch is None else msgspec.convert(switch.to_json(), PlacementSwitchInfo),
    )


def _queue_waits(waited: dict[str, tuple[int, float]]) -> list[QueueWaitInfo]:
    order = [label for _, label in PRIORITY_CLASSES]
    return [
        QueueWaitInfo(priority=label, waited=count, mean_wait_s=round(total / count, 3))
        for label, (count, total) in sorted(waited.items(), key=lambda kv: order.index(kv[0]))
    ]


async def _monitor(monitor: MonitorStore) -> MonitorInfo | None:
    """The monitor holding the election lease now, with its epoch (its fencing token)."""
    try:
        status = await monitor.monitor_status()
    except CoordinationUnavailable:
        return None
    if status.holder is None or status.lease_epoch is None:
        return None
    return MonitorInfo(
        primary=status.holder, epoch=status.lease_epoch, fenced_rejects=status.fenced_rejects
    )
