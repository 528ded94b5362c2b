"""A model host runs only the node agent: importing it loads neither the server stack (Quart,
Hypercorn, SQLAlchemy, coredis) nor any module of the coordinator, so the host needs only what
the agent itself uses. Checked in a fresh interpreter, where nothing else has been imported."""

from __future__ import annotations

from tests.fixtures.fresh_imports import modules_after

SERVER_STACK = {"quart", "hypercorn", "sqlalchemy", "coredis", "quart_trio"}

_IMPORT_THE_AGENT = """
import tools.node_agent
import tools.node_agent.cli
from tools.node_agent import OllamaBackend, OpenAIBackend
# Building the HTTP backends (and their clients) is part of starting an agent.
OllamaBackend("http://127.0.0.1:1")
OpenAIBackend("http://127.0.0.1:1", api_key="")
"""
_SAMPLE_TELEMETRY = """
import argparse
from tools.node_agent.cli import telemetry_from_args
assert telemetry_from_args(argparse.Namespace(telemetry_interval="2")) is not None
"""


def _top_level(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_the_node_agent_imports_without_the_server_stack_or_the_coordinator() -> None:
    modules = modules_after(_IMPORT_THE_AGENT)
    assert "tools.node_agent.cli" in modules  # the probe did import what it says
    assert not _top_level(modules) & SERVER_STACK, sorted(_top_level(modules) & SERVER_STACK)
    assert not [m for m in modules if m.partition(".")[0] == "coordinator"], sorted(
        m for m in modules if m.startswith("coordinator")
    )


def test_sampling_host_telemetry_stays_inside_the_agent() -> None:
    # The sampler lives with the agent (tools/node_agent/telemetry/), shared with `gemmanet
    # telemetry-agent`: an agent that samples loads it, and still nothing of the coordinator
    # or of the server stack.
    modules = modules_after(_IMPORT_THE_AGENT + _SAMPLE_TELEMETRY)
    assert "tools.node_agent.telemetry.sampler" in modules
    assert not _top_level(modules) & SERVER_STACK, sorted(_top_level(modules) & SERVER_STACK)
    assert not [m for m in modules if m.partition(".")[0] == "coordinator"], sorted(
        m for m in modules if m.startswith("coordinator")
    )
