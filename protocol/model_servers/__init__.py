"""Talking to a model server (Ollama, an OpenAI-compatible server), sans-IO.

Shared by the node agent's HTTP backends and the coordinator's direct hosts, which each keep
only the thin part that owns the connection (open the stream, check the status, feed the bytes
in as they come, map their HTTP client's errors): ``tools/node_agent/backends.py`` and
``coordinator/hosts/host_client.py``. The agent must not import the coordinator, and the
coordinator must not import the tools, so what both speak lives here.

    generation.py    what a server is asked (the model, a prompt or a conversation, the
                     options) and what it reports at the end (usage, finish reason)
    server_call.py   one streamed POST (path, body, headers, the reader of its lines), the
                     short HostError of every way a server fails, the counts read safely
    bounded_reads.py how much of an answer is read: a stream cut into lines here (1 MiB a
                     line, 128 MiB in all), an error body (4 KiB), a whole answer such as a
                     model list (1 MiB)
    ollama_wire.py   Ollama's own API: /api/chat and /api/generate, NDJSON streams
    openai_wire.py   the OpenAI-compatible API: /v1/chat/completions and /v1/completions,
                     server-sent events
"""

from protocol.model_servers.bounded_reads import (
    MAX_BODY_BYTES,
    MAX_ERROR_BODY_BYTES,
    MAX_LINE_BYTES,
    MAX_STREAM_BYTES,
    LineSplitter,
    bounded_body,
    encoded,
    lines_of,
    whole_body,
)
from protocol.model_servers.generation import Finish, Generation
from protocol.model_servers.ollama_wire import ollama_call, ollama_request, read_ollama_stream
from protocol.model_servers.openai_wire import openai_call, openai_request, read_openai_stream
from protocol.model_servers.server_call import (
    UNENCODED,
    HostError,
    ServerCall,
    load_json,
    short,
    status_error,
    token_count,
    usage_of,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_ERROR_BODY_BYTES",
    "MAX_LINE_BYTES",
    "MAX_STREAM_BYTES",
    "UNENCODED",
    "Finish",
    "Generation",
    "HostError",
    "LineSplitter",
    "ServerCall",
    "bounded_body",
    "encoded",
    "lines_of",
    "load_json",
    "ollama_call",
    "ollama_request",
    "openai_call",
    "openai_request",
    "read_ollama_stream",
    "read_openai_stream",
    "short",
    "status_error",
    "token_count",
    "usage_of",
    "whole_body",
]
