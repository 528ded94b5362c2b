"""Code that reaches into a dependency's private parts checks that dependency's release first:
the Hypercorn workarounds (coordinator/server/hypercorn_patches.py) and the simulator's trio hook
(sim/trio_hook.py) refuse, in one line, a release outside the range they were written for,
rather than patch a renamed method wrongly or replay with an unpinned scheduler."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import pytest

from coordinator.errors import StartupRefused
from coordinator.server import hypercorn_patches
from sim import trio_hook
from tests.fixtures.processes import free_port

ROOT = Path(__file__).resolve().parents[1]


def pretend(monkeypatch: pytest.MonkeyPatch, distribution: str, version: str | None) -> None:
    """``importlib.metadata.version(distribution)`` answers ``version`` (None: not installed)."""
    real: Callable[[str], str] = metadata.version

    def version_of(name: str) -> str:
        if name.lower() != distribution:
            return real(name)
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(metadata, "version", version_of)


@pytest.mark.parametrize("version", ["0.17.2", "0.19.0", "0.19.0rc1", "1.0.0", "dev"])
def test_an_unsupported_hypercorn_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    pretend(monkeypatch, "hypercorn", version)
    with pytest.raises(StartupRefused) as refused:
        hypercorn_patches.apply()
    line = str(refused.value)
    assert len(line.splitlines()) == 1, line
    assert f"Hypercorn {version} is installed" in line, line
    assert "hypercorn>=0.18,<0.19" in line, line


def test_a_hypercorn_without_metadata_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend(monkeypatch, "hypercorn", None)
    with pytest.raises(StartupRefused, match=r"Hypercorn \(version unknown\) is installed"):
        hypercorn_patches.check_hypercorn_version()


def test_a_hypercorn_of_the_range_is_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    hypercorn_patches.apply()  # the installed one (constraints.txt's)
    pretend(monkeypatch, "hypercorn", "0.18.9")
    hypercorn_patches.apply()


def run_pretending(
    tmp_path: Path, distribution: str, version: str, *argv: str
) -> subprocess.CompletedProcess[str]:
    """``gemmanet ARGV`` in a process of its own, where only the version lookup lies."""
    script = f"""
import sys
from importlib import metadata
real = metadata.version
metadata.version = lambda name: {version!r} if name.lower() == {distribution!r} else real(name)
from coordinator.cli import main
sys.exit(main({list(argv)!r}))
"""
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "GEMMANET_DATABASE_URL": f"sqlite:///{tmp_path / 'gemmanet.db'}",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_gemmanet_serve_refuses_an_unsupported_hypercorn_in_one_line(tmp_path: Path) -> None:
    done = run_pretending(tmp_path, "hypercorn", "0.19.1", "serve", "--port", str(free_port()))
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("gemmanet: Hypercorn 0.19.1 is installed"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.parametrize("version", ["0.26.2", "0.36.0", "1.0.0"])
def test_the_simulator_refuses_an_unsupported_trio_in_one_line(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    pretend(monkeypatch, "trio", version)
    with pytest.raises(StartupRefused) as refused:
        # Refused before it touches trio's scheduler (this process keeps running tests).
        trio_hook.pin_trio_scheduler("1:trio")
    line = str(refused.value)
    assert len(line.splitlines()) == 1, line
    assert f"trio {version} is installed" in line and "trio>=0.27,<0.36" in line, line


def test_the_installed_trio_is_in_the_simulators_range() -> None:
    trio_hook.check_trio_version()


def test_gemmanet_sim_refuses_an_unsupported_trio_in_one_line(tmp_path: Path) -> None:
    done = run_pretending(tmp_path, "trio", "0.36.0", "sim", "run", "--seed", "1")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("gemmanet: trio 0.36.0 is installed"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
