"""Test doubles of the external model servers a node agent talks to.

Each fake is a tiny ASGI app served by Hypercorn's trio worker on 127.0.0.1, speaking the real
wire format and echoing the prompt word by word; it can be told to fail (``fail="http"``,
``"midstream"``, ``"truncate"``) and records what it received.

* :class:`FakeOllama` - ``POST /api/generate`` NDJSON (``python -m tools.fakes.ollama``).
* :class:`FakeOpenAI` - ``POST /v1/chat/completions`` SSE (``python -m tools.fakes.openai``).
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
