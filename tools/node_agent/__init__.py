"""The ``gemmanet node`` agent.

It connects out to a coordinator's ``/ws/node`` WebSocket, speaks node protocol v2 (v1 to an
older coordinator), and runs the tasks it is assigned against a model backend (echo, Ollama,
OpenAI-compatible). It imports only ``protocol/`` (the envelopes, the model servers' wire
formats, the log line format) and its own modules, never the coordinator: a model host runs it
without the server's dependencies (tests/coordinator/test_node_agent_imports.py).

* ``cli`` - :func:`add_node_arguments` and :func:`run_node`, called by ``gemmanet node``.
* ``agent`` - :class:`NodeAgent`: the connection, reconnect, heartbeat and drain logic.
* ``config`` - :class:`AgentConfig`, the exits that end the agent, the reconnect backoff.
* ``task_run`` - one task against the backend: its refusal, chunks, result or error.
* ``backends`` - the model backends behind ``generate(request)``, and the httpx stream that
  carries the wire formats of ``protocol/model_servers/``.
* ``logs`` - the root log handler when the agent runs alone (``python -m tools.node_agent``).
* ``settings`` - flag parsing and validation (:class:`NodeSettings`).
* ``silence`` - the coordinator's silence, judged on the time this process ran (a stall of the
  node's own machine is not a dead coordinator).
* ``stats`` - what the node saw, counted at the node (``GEMMANET_NODE_STATS_FILE``).
"""

from tools.node_agent.agent import AgentConfig, AgentExit, NodeAgent, backoff_delay
from tools.node_agent.backends import (
    Backend,
    BackendError,
    EchoBackend,
    OllamaBackend,
    OpenAIBackend,
    make_backend,
    split_words,
)
from tools.node_agent.cli import add_node_arguments, run_node, serve_node, settings_from_args
from tools.node_agent.settings import (
    Latency,
    NodeSettings,
    UsageError,
    coordinator_ws_url,
    parse_latency,
)

__all__ = [
    "AgentConfig",
    "AgentExit",
    "Backend",
    "BackendError",
    "EchoBackend",
    "Latency",
    "NodeAgent",
    "NodeSettings",
    "OllamaBackend",
    "OpenAIBackend",
    "UsageError",
    "add_node_arguments",
    "backoff_delay",
    "coordinator_ws_url",
    "make_backend",
    "parse_latency",
    "run_node",
    "serve_node",
    "settings_from_args",
    "split_words",
]
