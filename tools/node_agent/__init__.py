"""The ``gemmanet node`` agent.

It connects out to a coordinator's ``/ws/node`` WebSocket, speaks node protocol v2 (v1 to an
older coordinator), and runs the tasks it is assigned against a model backend (echo, Ollama,
OpenAI-compatible). It imports only ``protocol/`` (the envelopes, the model servers' wire
formats, the log line format) and its own modules, never the coordinator: a model host runs it
without the server's dependencies (tests/coordinator/test_node_agent_imports.py).

cli.py         ``gemmanet node``: flags, validation, signal handling, exit codes
agent.py       ``NodeAgent``: reconnects, and serves each connection: tasks, drain
reconnect.py   where and when to dial next: the coordinators in turn, at once when told to move
heartbeats.py  the heartbeats it sends: every interval, and at once when the backend flips
connection.py  one connection: the hello and its welcome, the socket's single writer, the close
config.py      ``AgentConfig``, the exits that end the agent, the reconnect backoff
settings.py    validated settings of one agent, parsed from command-line strings
task_run.py    one task against the backend: its refusal, chunks, result or error
backends.py    the model backends (echo, Ollama, OpenAI-compatible), one small class each
prefix_cache.py  the echo backend behind a modelled prefix (KV) cache, for benchmarks
health.py      whether the backend answers: checked before the hello, then periodically;
               while it does not, the node serves none of its models
silence.py     waiting for the coordinator's next message; deciding it has gone silent
stats.py       what the agent saw, counted at the node
logs.py        its log set-up when it runs alone
__main__.py    ``python -m tools.node_agent``
telemetry/     host telemetry samples (CPU, memory, GPUs) and ``gemmanet telemetry-agent``
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
