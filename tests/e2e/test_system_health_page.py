"""The System Health page in a real headless Chromium (Debian's ``chromium``, driven by
Playwright through its executable path; no browser download), against two real coordinator
instances on a real Redis with real node agents on both.

An operator key sees both instances and every node with its state (an agent node whose backend
does not answer, and a direct host the monitor cannot reach, each with why), a node that joins
after the page loaded appears without a reload, and each node has separate CPU busy, GPU busy,
VRAM and GTT charts, a direct host too (from its own ``telemetry_url``, polled by the elected
monitor); a plain key sees the instances and the counts but no node detail anywhere in the DOM;
no page logs a console error.

Set ``GEMMANET_SYSTEM_HEALTH_SCREENSHOT=docs/img/system-health.png`` to keep a screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import CLI, Coordinator, Processes, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

CHROMIUM = "/usr/bin/chromium"
NODES_A, NODES_B, LATE = ("gpu-a1", "gpu-a2"), ("gpu-b1",), "late-a3"
#: an agent node whose model backend nobody answers, and a direct host (``[hosts]``) likewise,
#: with a telemetry agent of its own
DOWN, HOST = "down-b2", "box-c"
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


def set_gpu(root: Path, vram_used: float, gtt_used: float, busy: int = 50) -> None:
    """What a recorded card reports from now on (its agent reads the files at every sample)."""
    device = root / "class" / "drm" / "card0" / "device"
    device.mkdir(parents=True, exist_ok=True)
    files = {
        "gpu_busy_percent": busy,
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
) -> tuple[Processes, Coordinator, Coordinator, Path, str]:
    # The direct host: nobody answers at its URL, but its telemetry agent (a real
    # `gemmanet telemetry-agent` reading a recorded GPU) does.
    host_sysfs = tmp_path / "host-sysfs"
    set_gpu(host_sysfs, 3e9, 1e9, busy=20)
    agent_port = free_port()
    procs._popen(
        [*CLI, "telemetry-agent", "--port", str(agent_port), "--interval", "0.1"]
        + ["--sysfs-root", str(host_sysfs)]
    )
    operator_file = tmp_path / "hosts.toml"
    operator_file.write_text(
        f'[hosts."{HOST}"]\nurl = "http://127.0.0.1:{free_port()}"\nkind = "ollama"\n'
        f'telemetry_url = "http://127.0.0.1:{agent_port}/telemetry"\n'
    )
    # Telemetry stored every 0.2 s instead of 5 s, so the charts fill within the test; both
    # instances are monitor candidates (one is elected and polls the host's agent).
    shared = procs.share_redis(
        redis_server,
        f"health{os.getpid()}",
        GEMMANET_TELEMETRY_INTERVAL_S="0.2",
        GEMMANET_CAPACITY_FILE=str(operator_file),
        GEMMANET_MONITOR="1",
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
    nobody = f"http://127.0.0.1:{free_port()}"
    down = ("--backend", "ollama", "--backend-url", nobody, *quiet)
    shared.node(b, DOWN, extra=down, wait_online=False)
    everyone = {*NODES_A, *NODES_B, DOWN, HOST}
    wait_until(lambda: {n["node_id"] for n in b.nodes()} == everyone, "every node online")
    return shared, a, b, sysfs, nobody


def test_system_health_page_in_chromium(cluster: Any, browser: Any) -> None:
    shared, a, b, sysfs, down_url = cluster
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
    expect(page.locator("#nodes tbody tr")).to_have_count(5, timeout=WAIT_MS)
    assert node_rows(page) == {
        "gpu-a1": "A",
        "gpu-a2": "A",
        "gpu-b1": "B",
        DOWN: "B",
        HOST: "direct",
    }
    expect(page.locator("#stat-monitor")).to_contain_text("(epoch ")

    # Each node's state, and why when it cannot serve: the agent's own account of its
    # backend, and for the direct host what the monitor's last poll met.
    def state(node_id: str) -> Any:
        return page.locator(f'#nodes tr[data-node-id="{node_id}"] td[data-host-state]')

    expect(state("gpu-a1")).to_have_attribute("data-host-state", "ok")
    expect(state(DOWN)).to_have_attribute("data-host-state", "unreachable")
    expect(state(DOWN).locator(".host-reason")).to_contain_text(f"ollama: GET {down_url}/api/tags")
    expect(state(HOST)).to_have_attribute("data-host-state", "unreachable", timeout=WAIT_MS)
    expect(state(HOST).locator(".host-reason")).to_contain_text("the monitor's last poll failed")
    expect(page.locator("#stat-queue")).to_have_text("0")
    expect(page.locator("#stat-affinity")).to_have_text("no placements yet")
    expect(page.locator("#stat-queue-wait")).to_have_text("nobody waited yet")

    # A node joining after the page loaded shows up without a reload (the marker survives).
    page.evaluate("window.__loadedOnce = true")
    shared.node(a, LATE, extra=("--telemetry-interval", "0"))
    expect(page.locator(f'#nodes tr[data-node-id="{LATE}"]')).to_have_count(1, timeout=WAIT_MS)
    assert node_rows(page)[LATE] == "A"
    assert page.evaluate("window.__loadedOnce") is True

    # Each node: CPU busy, GPU busy, VRAM and GTT charts, four separate elements; no
    # telemetry yet here.
    card = page.locator(f'#telemetry .card[data-node-id="{LATE}"]')
    expect(card).to_have_count(1, timeout=WAIT_MS)
    for chart in ("cpu", "gpu", "vram", "gtt"):
        assert card.locator(f"svg[data-chart={chart}]").count() == 1
        expect(card.locator(f"svg[data-chart={chart}]")).to_contain_text("no samples yet")
    assert card.locator("svg.chart").count() == 4

    # A plain key: the instances and the counts, no node detail anywhere in the DOM.
    plain = Page(browser, a)
    plain_page = plain.open_with(shared.create_key("client"))
    expect(plain_page.locator("#instances tbody tr")).to_have_count(2, timeout=WAIT_MS)
    expect(plain_page.locator("#stat-nodes")).to_have_text("5", timeout=WAIT_MS)
    expect(plain_page.locator("#nodes-denied")).to_be_visible()
    plain.wait_for_polls(1)
    dom = plain_page.content()
    for node_id in (*NODES_A, *NODES_B, LATE, DOWN, HOST):
        assert node_id not in dom, node_id
    assert plain_page.locator("#telemetry .card").count() == 0

    charts_with_samples(browser, b, operator, sysfs)
    for seen in (operator, plain):
        assert seen.errors == [], seen.errors


def charts_with_samples(browser: Any, coord: Coordinator, operator: Page, sysfs: Path) -> None:
    """Real telemetry, end to end: gpu-a1's agent reads its (recorded) GPU, sends samples in
    its heartbeats, instance A stores them in Redis, and the page on B draws them — one line in
    each of the CPU busy, GPU busy, VRAM and GTT charts, the memories' sum only as text. And
    the direct host's, from its telemetry agent through the elected monitor."""
    viewer = Page(browser, coord)
    page = viewer.open_with(admin_key_of(operator))
    card = page.locator('#telemetry .card[data-node-id="gpu-a1"]')
    vram, gtt = card.locator("svg[data-chart=vram]"), card.locator("svg[data-chart=gtt]")
    cpu, gpu = card.locator("svg[data-chart=cpu]"), card.locator("svg[data-chart=gpu]")
    sync_api = pytest.importorskip("playwright.sync_api")
    for chart in (vram, gtt, cpu, gpu):
        sync_api.expect(chart.locator("polyline.used")).to_have_count(1, timeout=WAIT_MS)
    # The card's memory and busy rise; the page follows without a reload.
    for step in range(1, 6):
        set_gpu(sysfs, (10 + step) * 1e9, (2 + step / 2) * 1e9, busy=50 + 5 * step)
        viewer.wait_for_polls(1)
    # Each chart plots its own memory: the latest values, never their sum.
    sync_api.expect(vram).to_contain_text("15.0 GB used of 24.0 GB", timeout=WAIT_MS)
    sync_api.expect(gtt).to_contain_text("4.5 GB used of 32.0 GB", timeout=WAIT_MS)
    sync_api.expect(card).to_contain_text("derived: VRAM + GTT in use 19.5 GB of 56.0 GB")
    sync_api.expect(gpu).to_contain_text("75% busy", timeout=WAIT_MS)
    # CPU busy is this machine's own, measured by the agent: some percentage.
    sync_api.expect(cpu).to_contain_text(re.compile(r"^\d+% busy$"))
    assert int(gpu.get_attribute("data-samples")) >= 3
    # The direct host's card, from the samples the monitor polled from its agent.
    host = page.locator(f'#telemetry .card[data-node-id="{HOST}"]')
    sync_api.expect(host).to_contain_text("direct host", timeout=WAIT_MS)
    sync_api.expect(host.locator("svg[data-chart=gpu]")).to_contain_text("20% busy")
    sync_api.expect(host.locator("svg[data-chart=vram]")).to_contain_text("3.0 GB used of 24.0 GB")
    sync_api.expect(host.locator("svg[data-chart=cpu] polyline.used")).to_have_count(1)
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
