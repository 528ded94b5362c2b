"""The enablement gate of placement on direct hosts, pure: whether an instance may place any
request on a ``[hosts]`` entry now, from its setting and the shared switch.

``GEMMANET_HOST_PLACEMENT`` is one of

* ``gated`` (the default): follow the shared switch that ``gemmanet audit --enable`` turns on
  (only when every gate of the audit is green) and ``gemmanet audit --disable`` turns off. A
  switch never set, or one that cannot be read as a switch, is off: a new deployment places
  nothing on its hosts until an operator has audited it and said so.
* ``on``: place on a host as soon as its monitor facts are fresh, switch or no switch (what
  every deployment did before the gate existed; needs Redis, ``Settings.check``).
* ``off``: never place on a host, whatever the switch says.

The gate sits in front of the facts rule (``direct_hosts.host_state``): an open gate makes no
host a candidate on its own, it only lets the hosts whose facts are fresh be one. Closing it
stops new placements at the instance's next look; calls already running finish (nothing here
cancels them).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

__all__ = ["HOST_PLACEMENTS", "GateView", "HostPlacement", "hosts_placeable"]

HostPlacement = Literal["gated", "on", "off"]
HOST_PLACEMENTS: tuple[str, ...] = get_args(HostPlacement)


def hosts_placeable(mode: HostPlacement, switch_on: bool | None) -> bool:
    """Whether placement may use direct hosts now. ``switch_on``: the shared switch as last
    read (None: never set, unreadable, or not read yet), consulted only when ``gated``."""
    if mode == "on":
        return True
    if mode == "off":
        return False
    return switch_on is True


class GateView(NamedTuple):
    """The gate as one instance sees it, for its metrics (``gemmanet_host_placement_*``)."""

    mode: HostPlacement
    #: ``hosts_placeable`` now
    open: bool
    #: whether the last read of the switch succeeded (None: not ``gated``, the switch unread)
    switch_readable: bool | None
