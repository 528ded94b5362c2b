"""LiteLLM pointed at the OpenAI-compatible API, as its users configure a custom OpenAI
endpoint (``openai/<model>`` with ``api_base``): a completion with usage and the token bound,
and a stream, through a real coordinator and echo node."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import Coordinator, Processes

# LiteLLM fetches its model price list from the internet at import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

pytestmark = [
    pytest.mark.e2e,
    # LiteLLM's own pydantic models warn about ReadOnly TypedDict items; not ours to fix.
    pytest.mark.filterwarnings("ignore:Items? .* using the `ReadOnly` qualifier"),
]

MESSAGES = [
    {"role": "system", "content": "Repeat."},
    {"role": "user", "content": "alpha beta gamma"},
]
TRANSCRIPT = "system: Repeat.\nuser: alpha beta gamma\nassistant:"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Processes, Coordinator]]:
    procs = Processes(Path(tmp_path_factory.mktemp("litellm")))
    try:
        coord = procs.coordinator()
        procs.node(coord, "echo-1", models=("echo",))
        yield procs, coord
    finally:
        procs.stop_all()


def _call(served: tuple[Processes, Coordinator], **kwargs: Any) -> Any:
    procs, coord = served
    return litellm.completion(
        model="openai/echo",
        api_base=coord.url + "/v1",
        api_key=procs.create_key(),
        messages=MESSAGES,
        num_retries=0,
        **kwargs,
    )


def test_a_litellm_completion_gets_the_answer_and_its_usage(
    served: tuple[Processes, Coordinator],
) -> None:
    response = _call(served, temperature=0.1, max_tokens=50)
    assert response.choices[0].message.content == TRANSCRIPT
    assert response.choices[0].finish_reason == "stop"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (4, 7)


def test_litellm_passes_the_token_bound(served: tuple[Processes, Coordinator]) -> None:
    response = _call(served, max_tokens=2)
    assert response.choices[0].message.content == "system: Repeat."
    assert response.choices[0].finish_reason == "length"


def test_a_litellm_stream_joins_to_the_answer(served: tuple[Processes, Coordinator]) -> None:
    chunks = list(_call(served, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == TRANSCRIPT
