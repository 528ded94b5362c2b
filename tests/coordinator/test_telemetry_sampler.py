"""The telemetry sampler on recorded sysfs trees (an AMD card with VRAM and GTT; a machine
without GPUs) and live on this machine, and how the coordinator reads a sample it did not
make (``protocol.parse_sample``)."""

from __future__ import annotations

import math
from pathlib import Path

import msgspec
import pytest
import trio

from protocol.telemetry import MAX_SAMPLE_BYTES, TelemetrySample, encode_sample, parse_sample
from tools.node_agent.telemetry.nvml_gpu import NvmlGpus
from tools.node_agent.telemetry.sampler import (
    LiveTelemetry,
    Sampler,
    combine_gpus,
    cpu_busy_between,
)
from tools.node_agent.telemetry.sysfs_gpu import GpuReading, read_drm_gpus

GPU_FIELDS = ("gpu_busy", "vram_used_gb", "vram_total_gb", "gtt_used_gb", "gtt_total_gb")

# What an amdgpu card (a 16 GiB Radeon RX 6800 XT) really shows: bytes and a percentage.
AMD_CARD = {
    "gpu_busy_percent": "37\n",
    "mem_info_vram_used": "4294967296\n",
    "mem_info_vram_total": "17163091968\n",
    "mem_info_gtt_used": "123456789\n",
    "mem_info_gtt_total": "16777216000\n",
}


def record_card(root: Path, name: str, files: dict[str, str]) -> None:
    device = root / "class" / "drm" / name / "device"
    device.mkdir(parents=True)
    for file, text in files.items():
        (device / file).write_text(text)


class NoNvml(NvmlGpus):
    """This machine's NVML, whatever it has, must not leak into the recorded-tree tests."""

    def read(self) -> list[GpuReading]:
        return []


def amd_tree(root: Path) -> Path:
    record_card(root, "card0", AMD_CARD)
    # A connector entry and a card without any of the files (a simple framebuffer): not GPUs.
    record_card(root, "card0-DP-1", {"gpu_busy_percent": "99\n"})
    record_card(root, "card1", {"uevent": "DRIVER=simpledrm\n"})
    return root


def test_an_amd_card_with_vram_and_gtt(tmp_path: Path) -> None:
    [card] = read_drm_gpus(amd_tree(tmp_path))
    assert card == GpuReading(
        busy=0.37,
        vram_used=4294967296,
        vram_total=17163091968,
        gtt_used=123456789,
        gtt_total=16777216000,
    )
    fields = combine_gpus([card])
    assert fields == {
        "gpu_busy": 0.37,
        "vram_used_gb": 4.294967296,
        "vram_total_gb": 17.163091968,
        "gtt_used_gb": 0.123456789,
        "gtt_total_gb": 16.777216,
    }


def test_each_file_on_its_own(tmp_path: Path) -> None:
    # A card without GTT files and with a garbled VRAM counter: those are unknown, the rest read.
    record_card(
        tmp_path,
        "card2",
        {"gpu_busy_percent": "5\n", "mem_info_vram_used": "n/a\n", "mem_info_vram_total": "8\n"},
    )
    [card] = read_drm_gpus(tmp_path)
    assert card == GpuReading(busy=0.05, vram_used=None, vram_total=8)


def test_two_cards_add_memory_and_average_busy(tmp_path: Path) -> None:
    record_card(tmp_path, "card0", AMD_CARD)
    record_card(tmp_path, "card10", {"gpu_busy_percent": "63\n", "mem_info_vram_total": "1000"})
    fields = combine_gpus(read_drm_gpus(tmp_path))
    assert fields["gpu_busy"] == pytest.approx(0.5)
    assert fields["vram_total_gb"] == pytest.approx(17.163092968)
    assert fields["gtt_total_gb"] == pytest.approx(16.777216)


async def test_a_sample_on_a_recorded_amd_tree(tmp_path: Path) -> None:
    sampler = Sampler(sysfs_root=amd_tree(tmp_path), nvml=NoNvml(), clock=lambda: 1234.5)
    sample = await sampler.sample(0.05)
    assert sample.at == 1234.5
    assert (sample.gpu_busy, sample.vram_used_gb, sample.gtt_total_gb) == (
        0.37,
        4.294967296,
        16.777216,
    )


async def test_a_machine_without_gpus_has_null_gpu_fields(tmp_path: Path) -> None:
    for root in (tmp_path, tmp_path / "missing"):
        sample = await Sampler(sysfs_root=root, nvml=NoNvml()).sample(0.05)
        as_json = msgspec.json.decode(encode_sample(sample))
        assert all(as_json[field] is None for field in GPU_FIELDS), as_json
        assert set(as_json) == {"at", "cpu_busy", "memory_used_gb", "memory_total_gb", *GPU_FIELDS}


async def test_live_on_this_machine() -> None:
    # This machine (CI, the dev container) has no GPU; CPU and memory are real numbers.
    live = LiveTelemetry(Sampler(), interval_s=0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(live.run)
        first = await live.current()
        await trio.sleep(0.25)
        assert live.latest is not None and live.latest.at > first.at  # it keeps sampling
        nursery.cancel_scope.cancel()
    sample = live.latest
    if Path("/sys/class/drm").exists() or NvmlGpus().read():
        pytest.skip("this machine has a GPU; the null-GPU check is for GPU-less machines")
    assert all(getattr(sample, field) is None for field in GPU_FIELDS)
    assert sample.cpu_busy is not None and 0.0 <= sample.cpu_busy <= 1.0
    assert sample.memory_total_gb is not None and sample.memory_used_gb is not None
    assert 0.0 < sample.memory_used_gb < sample.memory_total_gb < 1e5
    assert parse_sample(encode_sample(sample)) == sample


async def test_sampling_cpu_does_not_block_the_loop() -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.sleep(0.01)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await Sampler(nvml=NoNvml()).sample(0.3)
        nursery.cancel_scope.cancel()
    assert ticks >= 10


def test_cpu_busy_between_readings() -> None:
    # 4 s elapsed across the counters, 3 of them idle: 25 % busy.
    assert cpu_busy_between((10.0, 20.0), (11.0, 23.0), idle=3.0) == 0.25
    assert cpu_busy_between((1.0,), (1.0,), idle=0.0) is None
    assert cpu_busy_between((1.0,), (2.0,), idle=5.0) == 0.0  # clamped


# -- what the coordinator accepts from a node -----------------------------------------------


def test_a_valid_sample_is_parsed_and_unknown_fields_are_not_kept() -> None:
    data = b'{"at": 1700000000.5, "cpu_busy": 0.5, "gtt_used_gb": 1, "x-junk": [1, 2]}'
    sample = parse_sample(data)
    assert sample == TelemetrySample(at=1700000000.5, cpu_busy=0.5, gtt_used_gb=1.0)
    assert b"junk" not in encode_sample(sample)


@pytest.mark.parametrize(
    "data",
    [
        b'"junk"',
        b"[1, 2, 3]",
        b"null",
        b"{}",  # no "at"
        b'{"at": "now"}',
        b'{"at": 1, "cpu_busy": 1.5}',
        b'{"at": 1, "gpu_busy": -0.1}',
        b'{"at": 1, "vram_used_gb": 1e308}',
        b'{"at": 1e300}',
        b'{"at": 1, "memory_used_gb": "lots"}',
        b'{"at": 1, "cpu_busy": NaN}',
        b'{"at": 1' + b" " * MAX_SAMPLE_BYTES + b"}",  # valid, but no sample is that big
        b"[" * 5000 + b"]" * 5000,
        b"\xff\xfe",
    ],
)
def test_junk_is_not_a_sample(data: bytes) -> None:
    assert parse_sample(data) is None
    assert parse_sample(msgspec.Raw(data)) is None


def test_bounds_accept_the_extremes() -> None:
    sample = parse_sample(b'{"at": 0, "cpu_busy": 1, "gpu_busy": 0, "vram_total_gb": 1000000}')
    assert sample is not None and sample.vram_total_gb == 1e6 and not math.isnan(sample.at)
