"""OpenAI request bodies as a task's conversation and options (coordinator/api/openai/params.py):
roles and order kept, text parts joined, every sampling parameter mapped to its option, and a
400 naming each parameter no node can honour."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.api.openai.params import chat_messages, completion_prompt, options_of
from coordinator.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from coordinator.errors import UnsupportedContent, UnsupportedParameter
from protocol import Message, Options


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=ChatCompletionRequest)


def text(**fields: Any) -> CompletionRequest:
    body = {"model": "m", "prompt": "hi", **fields}
    return msgspec.json.decode(msgspec.json.encode(body), type=CompletionRequest)


def test_messages_keep_roles_and_order_and_parts_are_joined() -> None:
    body = chat(
        messages=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None},
            {"role": "function", "content": "42"},
        ]
    )
    assert chat_messages(body.messages) == [
        Message(role="developer", content="Be brief."),
        Message(role="user", content="a\nb"),
        Message(role="assistant", content=""),
        Message(role="tool", content="42"),
    ]


def test_an_image_part_is_refused_naming_it() -> None:
    body = chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}])
    with pytest.raises(UnsupportedContent, match=r"messages\[0\]\.content\[0\]"):
        chat_messages(body.messages)


def test_every_sampling_parameter_becomes_its_option() -> None:
    options = options_of(
        chat(
            max_tokens=9,
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            stop="END",
            seed=-3,
            presence_penalty=0.1,
            frequency_penalty=-0.2,
            response_format={"type": "json_object"},
            user="ignored",
            metadata={"ignored": "too"},
        )
    )
    assert options == Options(
        max_tokens=9,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop=["END"],
        seed=-3,
        presence_penalty=0.1,
        frequency_penalty=-0.2,
        format="json",
    )


def test_max_completion_tokens_wins_over_the_older_max_tokens() -> None:
    assert options_of(chat(max_tokens=5, max_completion_tokens=7)).max_tokens == 7


def test_a_json_schema_is_passed_on() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    options = options_of(
        chat(
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
        )
    )
    assert (options.format, options.json_schema) == ("json", schema)
    with pytest.raises(UnsupportedParameter) as caught:
        options_of(chat(response_format={"type": "json_schema", "json_schema": {"name": "x"}}))
    assert caught.value.param == "response_format"


def test_nothing_set_is_no_options() -> None:
    assert options_of(chat()).is_empty()
    assert options_of(chat(n=1, response_format={"type": "text"})).is_empty()


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3}, "n"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 1}, "top_logprobs"),
        ({"logit_bias": {"1": 2}}, "logit_bias"),
        ({"audio": {"voice": "x"}}, "audio"),
        ({"prediction": {"type": "content"}}, "prediction"),
    ],
)
def test_a_chat_parameter_no_node_can_honour_is_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(UnsupportedParameter) as caught:
        options_of(chat(**fields))
    assert caught.value.param == param and caught.value.status == 400


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"echo": True}, "echo"), ({"suffix": "x"}, "suffix"), ({"best_of": 2}, "best_of"),
     ({"logprobs": 1}, "logprobs"), ({"n": 2}, "n")],
)  # fmt: skip
def test_a_completion_parameter_no_node_can_honour_is_refused_by_name(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(UnsupportedParameter) as caught:
        options_of(text(**fields))
    assert caught.value.param == param


def test_a_completion_takes_one_prompt() -> None:
    assert completion_prompt(text(prompt="a")) == completion_prompt(text(prompt=["a"])) == "a"
    with pytest.raises(UnsupportedParameter) as caught:
        completion_prompt(text(prompt=["a", "b"]))
    assert caught.value.param == "prompt"


@given(
    st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=16)
    | st.text(min_size=1, max_size=20)
)
def test_stop_is_a_string_or_a_list(stop: str | list[str]) -> None:
    expected = [stop] if isinstance(stop, str) else stop
    assert options_of(chat(stop=stop)).stop == expected


@pytest.mark.parametrize(
    "fields",
    [{"max_tokens": 0}, {"temperature": -0.1}, {"top_p": 1.5}, {"stop": ["x"] * 17},
     {"seed": 2**64}, {"presence_penalty": 3}],
)  # fmt: skip
def test_out_of_range_parameters_do_not_decode(fields: dict[str, Any]) -> None:
    with pytest.raises(msgspec.ValidationError):
        chat(**fields)
