"""Test doubles of the external model servers a node agent talks to.

Each fake is a tiny ASGI app served by Hypercorn's trio worker on 127.0.0.1, speaking the real
wire format and echoing the prompt (a chat: the last user message) word by word, with usage; it
can be told to fail (``fail="http"``, ``"midstream"``, ``"truncate"``) and records what it
received. It cannot drift from the real API: every request body is checked against the real
client library's request types, and every answer is built in its response types.

* :class:`FakeOllama` - ``POST /api/chat`` and ``/api/generate``, NDJSON
  (``python -m tools.fakes.ollama``); checked with the ``ollama`` library's types.
* :class:`FakeOpenAI` - ``POST /v1/chat/completions`` and ``/v1/completions``, SSE
  (``python -m tools.fakes.openai``); checked with the ``openai`` SDK's types.

ollama.py          the fake Ollama
openai.py          the fake OpenAI-compatible server
_server.py         the plumbing both share: a tiny ASGI base served by Hypercorn's trio worker
_checks.py         checking a request body strictly against a client library's pydantic types
_ollama_types.py   what the fake Ollama accepts and answers, in the ollama library's types
_openai_types.py   what the fake OpenAI server accepts and answers, in the openai SDK's types
"""

from typing import TYPE_CHECKING, Any

from tools.fakes._server import FAIL_MODES, FakeModelServer

if TYPE_CHECKING:
    from tools.fakes.ollama import FakeOllama
    from tools.fakes.openai import FakeOpenAI

__all__ = ["FAIL_MODES", "FakeModelServer", "FakeOllama", "FakeOpenAI"]


def __getattr__(name: str) -> Any:
    # Imported lazily so `python -m tools.fakes.ollama` does not import itself twice.
    if name == "FakeOllama":
        from tools.fakes.ollama import FakeOllama

        return FakeOllama
    if name == "FakeOpenAI":
        from tools.fakes.openai import FakeOpenAI

        return FakeOpenAI
    raise AttributeError(f"module 'tools.fakes' has no attribute {name!r}")
