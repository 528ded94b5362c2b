"""The System Health page in a real headless Chromium (Debian's ``chromium``, driven by
Playwright through its executable path; no browser download), against two real coordinator
instances on a real Redis with real node agents on both.

An operator key sees both instances and every node, a node that joins after the page loaded
appears without a reload, and each node has separate VRAM and GTT charts; a plain key sees the
instances and the counts but no node detail anywhere in the DOM; no page logs a console error.

Set ``GEMMANET_SYSTEM_HEALTH_SCREENSHOT=docs/img/system-health.png`` to keep a screenshot.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import Coordinator, Processes, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

CHROMIUM = "/usr/bin/chromium"
NODES_A, NODES_B, LATE = ("gpu-a1", "gpu-a2"), ("gpu-b1",), "late-a3"
WAIT_MS = 10_000


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMIUM)):
        pytest.skip("chromium not installed (apt-get install chromium; tools/run-tests.sh does)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


class Page:
    """A page in a fresh context (its own sessionStorage) that records every console error."""

    def __init__(self, browser: Any, coord: Coordinator) -> None:
        self.context = browser.new_context(viewport={"width": 1200, "height": 900})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.url = f"{coord.url}/system-health"

    def open_with(self, key: str) -> Any:
        self.page.goto(self.url)
        self.page.fill("#key-input", key)
        self.page.click("#key-form button[type=submit]")
        return self.page

    def wait_for_polls(self, count: int) -> None:
        """Until the page has refreshed ``count`` more times."""
        page = self.page
        for _ in range(count):
            before = page.text_content("#refreshed")
            page.wait_for_function(
                "b => document.getElementById('refreshed').textContent !== b",
                arg=before,
                timeout=WAIT_MS,
            )


def node_rows(page: Any) -> dict[str, str]:
    """node id -> owner instance, as the nodes table shows them."""
    rows = page.locator("#nodes tbody tr")
    return {
        rows.nth(i).get_attribute("data-node-id"): rows.nth(i).locator("td").nth(1).text_content()
        for i in range(rows.count())
    }


@pytest.fixture
def cluster(procs: Processes, redis_server: Any) -> tuple[Processes, Coordinator, Coordinator]:
    shared = procs.share_redis(redis_server, f"health{os.getpid()}")
    a, b = shared.two_instances()
    # Started together (each agent is a process of its own), then awaited together.
    for node_id in NODES_A:
        extra = ("--max-parallel", "2", "--vram-gb", "24")
        shared.node(a, node_id, extra=extra, wait_online=False)
    for node_id in NODES_B:
        shared.node(b, node_id, extra=("--max-parallel", "4"), wait_online=False)
    everyone = {*NODES_A, *NODES_B}
    wait_until(lambda: {n["node_id"] for n in b.nodes()} == everyone, "every node online")
    return shared, a, b


def test_system_health_page_in_chromium(cluster: Any, browser: Any) -> None:
    shared, a, b = cluster
    sync_api = pytest.importorskip("playwright.sync_api")
    expect = sync_api.expect
    operator = Page(browser, b)
    page = operator.open_with(shared.create_key("operator", admin=True))

    # Both instances, live, and the nodes of both with their owner.
    expect(page.locator("#instances tbody tr")).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator("#key-form")).to_be_hidden()
    assert page.get_attribute("#instances tbody tr:nth-child(1)", "data-instance-id") == "A"
    assert page.get_attribute("#instances tbody tr:nth-child(2)", "data-instance-id") == "B"
    expect(page.locator("#instances .state-live")).to_have_count(2)
    expect(page.locator("#nodes tbody tr")).to_have_count(3, timeout=WAIT_MS)
    assert node_rows(page) == {"gpu-a1": "A", "gpu-a2": "A", "gpu-b1": "B"}
    expect(page.locator("#stat-monitor")).to_have_text("no monitor elected")
    expect(page.locator("#stat-queue")).to_have_text("0")

    # A node joining after the page loaded shows up without a reload (the marker survives).
    page.evaluate("window.__loadedOnce = true")
    shared.node(a, LATE)
    expect(page.locator(f'#nodes tr[data-node-id="{LATE}"]')).to_have_count(1, timeout=WAIT_MS)
    assert node_rows(page)[LATE] == "A"
    assert page.evaluate("window.__loadedOnce") is True

    # Each node: a VRAM chart and a GTT chart, two separate elements; no telemetry yet here.
    card = page.locator(f'#telemetry .card[data-node-id="{LATE}"]')
    expect(card).to_have_count(1, timeout=WAIT_MS)
    assert card.locator("svg[data-chart=vram]").count() == 1
    assert card.locator("svg[data-chart=gtt]").count() == 1
    assert card.locator("svg.chart").count() == 2
    expect(card.locator("svg[data-chart=vram]")).to_contain_text("no samples yet")
    expect(card.locator("svg[data-chart=gtt]")).to_contain_text("no samples yet")

    # A plain key: the instances and the counts, no node detail anywhere in the DOM.
    plain = Page(browser, a)
    plain_page = plain.open_with(shared.create_key("client"))
    expect(plain_page.locator("#instances tbody tr")).to_have_count(2, timeout=WAIT_MS)
    expect(plain_page.locator("#stat-nodes")).to_have_text("4", timeout=WAIT_MS)
    expect(plain_page.locator("#nodes-denied")).to_be_visible()
    plain.wait_for_polls(1)
    dom = plain_page.content()
    for node_id in (*NODES_A, *NODES_B, LATE):
        assert node_id not in dom, node_id
    assert plain_page.locator("#telemetry .card").count() == 0

    charts_with_samples(browser, b, operator)
    for seen in (operator, plain):
        assert seen.errors == [], seen.errors


def charts_with_samples(browser: Any, coord: Coordinator, operator: Page) -> None:
    """Samples of the agreed telemetry shape are drawn: one line in the VRAM chart, another in
    the GTT chart, and their sum only as text. This branch's coordinator has no telemetry yet,
    so the browser adds samples to the real answers (``telemetry`` on one node, and the
    history endpoint) on their way in."""
    samples = [
        {
            "at": 1_800_000_000.0 + i,
            "cpu_busy": 0.25,
            "memory_used_gb": 12.0,
            "memory_total_gb": 64.0,
            "gpu_busy": 0.5,
            "vram_used_gb": 10.0 + i,
            "vram_total_gb": 24.0,
            "gtt_used_gb": 2.0 + i / 2,
            "gtt_total_gb": 32.0,
        }
        for i in range(6)
    ]

    def with_telemetry(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        for node in body.get("nodes") or []:
            node["telemetry"] = samples[-1] if node["node_id"] == "gpu-a1" else None
        route.fulfill(response=response, body=json.dumps(body))

    def history(route: Any) -> None:
        route.fulfill(json={"node_id": "gpu-a1", "samples": samples})

    viewer = Page(browser, coord)
    viewer.page.route("**/api/v1/cluster", with_telemetry)
    viewer.page.route("**/api/v1/nodes/gpu-a1/telemetry", history)
    page = viewer.open_with(admin_key_of(operator))
    card = page.locator('#telemetry .card[data-node-id="gpu-a1"]')
    vram, gtt = card.locator("svg[data-chart=vram]"), card.locator("svg[data-chart=gtt]")
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect(vram.locator("polyline.used")).to_have_count(1, timeout=WAIT_MS)
    sync_api.expect(gtt.locator("polyline.used")).to_have_count(1)
    assert vram.get_attribute("data-samples") == gtt.get_attribute("data-samples") == "6"
    # Each chart plots its own memory: the latest values, never their sum.
    assert "15.0 GB used of 24.0 GB" in vram.text_content()
    assert "4.5 GB used of 32.0 GB" in gtt.text_content()
    assert "derived: VRAM + GTT in use 19.5 GB of 56.0 GB" in card.text_content()
    other = page.locator('#telemetry .card[data-node-id="gpu-b1"] svg[data-chart=vram]')
    sync_api.expect(other).to_contain_text("no samples yet")
    screenshot = os.environ.get("GEMMANET_SYSTEM_HEALTH_SCREENSHOT")
    if screenshot:
        Path(screenshot).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=screenshot, full_page=True)
    assert viewer.errors == [], viewer.errors


def admin_key_of(page: Page) -> str:
    key = page.page.evaluate("sessionStorage.getItem('gemmanet.apiKey')")
    assert isinstance(key, str) and key
    return key
