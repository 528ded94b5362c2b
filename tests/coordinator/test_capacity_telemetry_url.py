"""The operator file's per-node ``telemetry_url`` (where a monitor may poll the node's
``gemmanet telemetry-agent``): read as given, refused when it is not an http(s) URL, and never
part of a budget."""

from __future__ import annotations

import pytest

from coordinator.capacity import NodeBudget, parse_capacity
from coordinator.errors import SettingsError


def test_a_node_may_name_its_telemetry_agent() -> None:
    capacity = parse_capacity(
        '[nodes."box-1"]\nvram_gb = 24\ntelemetry_url = "http://box-1:9105/telemetry"\n'
        '[nodes."box-2"]\nmax_parallel = 2\n'
    )
    assert capacity.nodes["box-1"] == NodeBudget(
        vram_gb=24.0, telemetry_url="http://box-1:9105/telemetry"
    )
    assert capacity.nodes["box-2"].telemetry_url is None
    # Telemetry is read-only: the budgets are what they would be without it.
    assert capacity.budgets("box-1", 4, 8.0) == (4, 24.0)


@pytest.mark.parametrize("value", ['"box-1:9105"', "9105", '"ftp://box/x"', '"http://a b"'])
def test_anything_but_an_http_url_is_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="telemetry_url"):
        parse_capacity(f'[nodes."box-1"]\ntelemetry_url = {value}\n')
