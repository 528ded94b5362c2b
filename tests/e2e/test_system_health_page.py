"""The System Health page in a real headless Chromium (Debian's ``chromium``, driven by
Playwright through its executable path; no browser download), against two real coordinator
instances on a real Redis with real node agents on both.

An operator key sees both instances and every node, a node that joins after the page loaded
appears without a reload, and each node has separate VRAM and GTT charts; a plain key sees the
instances and the counts but no node detail anywhere in the DOM; no page logs a console error.

Set ``GEMMANET_SYSTEM_HEALTH_SCREENSHOT=docs/img/system-health.png`` to keep a screenshot.
"""

from __future__ import annotations

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


#: gpu-a1's GPU, a recorded AMD sysfs tree its agent reads like the kernel's (GB of 10^9 bytes)
VRAM_TOTAL, GTT_TOTAL = 24e9, 32e9


def set_gpu(root: Path, vram_used: float, gtt_used: float) -> None:
    """What gpu-a1's card reports from now on (its agent reads the files at every sample)."""
    device = root / "class" / "drm" / "card0" / "device"
    device.mkdir(parents=True, exist_ok=True)
    files = {
        "gpu_busy_percent": 50,
        "mem_info_vram_used": vram_used,
        "mem_info_vram_total": VRAM_TOTAL,
        "mem_info_gtt_used": gtt_used,
        "mem_info_gtt_total": GTT_TOTAL,
    }
    for name, value in files.items():
        (device / f"{name}.new").write_text(f"{int(value)}\n")
        (device / f"{name}.new").replace(device / name)  # never a half-written file


@pytest.fixture
def cluster(
    procs: Processes, redis_server: Any, tmp_path: Path
) -> tuple[Processes, Coordinator, Coordinator, Path]:
    # Telemetry stored every 0.2 s instead of 5 s, so the charts fill within the test.
    shared = procs.share_redis(
        redis_server, f"health{os.getpid()}", GEMMANET_TELEMETRY_INTERVAL_S="0.2"
    )
    a, b = shared.two_instances()
    sysfs = tmp_path / "sysfs"
    set_gpu(sysfs, 10e9, 2e9)
    # Started together (each agent is a process of its own), then awaited together. Only
    # gpu-a1 sends telemetry (from its recorded GPU); the others send none.
    quiet = ("--telemetry-interval", "0")
    gpu = ("--telemetry-interval", "0.2", "--telemetry-sysfs-root", str(sysfs))
    for node_id in NODES_A:
        extra = ("--max-parallel", "2", "--vram-gb", "24", *(gpu if node_id == "gpu-a1" else quiet))
        shared.node(a, node_id, extra=extra, wait_online=False)
    for node_id in NODES_B:
        shared.node(b, node_id, extra=("--max-parallel", "4", *quiet), wait_online=False)
    everyone = {*NODES_A, *NODES_B}
    wait_until(lambda: {n["node_id"] for n in b.nodes()} == everyone, "every node online")
    return shared, a, b, sysfs


def test_system_health_page_in_chromium(cluster: Any, browser: Any) -> None:
    shared, a, b, sysfs = cluster
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
    expect(page.locator("#stat-affinity")).to_have_text("no placements yet")
    expect(page.locator("#stat-queue-wait")).to_have_text("nobody waited yet")

    # A node joining after the page loaded shows up without a reload (the marker survives).
    page.evaluate("window.__loadedOnce = true")
    shared.node(a, LATE, extra=("--telemetry-interval", "0"))
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

    charts_with_samples(browser, b, operator, sysfs)
    for seen in (operator, plain):
        assert seen.errors == [], seen.errors


def charts_with_samples(browser: Any, coord: Coordinator, operator: Page, sysfs: Path) -> None:
    """Real telemetry, end to end: gpu-a1's agent reads its (recorded) GPU, sends samples in
    its heartbeats, instance A stores them in Redis, and the page on B draws them — one line in
    the VRAM chart, another in the GTT chart, their sum only as text."""
    viewer = Page(browser, coord)
    page = viewer.open_with(admin_key_of(operator))
    card = page.locator('#telemetry .card[data-node-id="gpu-a1"]')
    vram, gtt = card.locator("svg[data-chart=vram]"), card.locator("svg[data-chart=gtt]")
    sync_api = pytest.importorskip("playwright.sync_api")
    sync_api.expect(vram.locator("polyline.used")).to_have_count(1, timeout=WAIT_MS)
    sync_api.expect(gtt.locator("polyline.used")).to_have_count(1)
    # The card's memory rises; the page follows without a reload.
    for step in range(1, 6):
        set_gpu(sysfs, (10 + step) * 1e9, (2 + step / 2) * 1e9)
        viewer.wait_for_polls(1)
    # Each chart plots its own memory: the latest values, never their sum.
    sync_api.expect(vram).to_contain_text("15.0 GB used of 24.0 GB", timeout=WAIT_MS)
    sync_api.expect(gtt).to_contain_text("4.5 GB used of 32.0 GB", timeout=WAIT_MS)
    sync_api.expect(card).to_contain_text("derived: VRAM + GTT in use 19.5 GB of 56.0 GB")
    assert int(vram.get_attribute("data-samples")) >= 3
    assert vram.get_attribute("data-samples") == gtt.get_attribute("data-samples")
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
