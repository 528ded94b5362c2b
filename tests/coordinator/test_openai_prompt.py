"""The prompt built from OpenAI chat messages (coordinator/api/openai_prompt.py): the documented
transcript, exactly, and a 400 for parts a prompt cannot carry."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.api.openai_prompt import build_prompt
from coordinator.api.openai_schemas import ChatCompletionRequest, ChatMessage, ContentPart
from coordinator.errors import UnsupportedContent


def messages(raw: list[dict[str, object]]) -> list[ChatMessage]:
    body = msgspec.json.encode({"model": "m", "messages": raw})
    return msgspec.json.decode(body, type=ChatCompletionRequest).messages


def test_each_message_is_a_role_line_then_the_answer_cue() -> None:
    prompt = build_prompt(
        messages(
            [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Why?"},
            ]
        )
    )
    assert prompt == "system: Be brief.\nuser: Hi\nassistant: Hello.\nuser: Why?\nassistant:"


def test_text_parts_join_with_newlines_and_null_content_is_empty() -> None:
    prompt = build_prompt(
        messages(
            [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None},
                {"role": "tool"},
                {"role": "developer", "content": []},
            ]
        )
    )
    assert prompt == "user: a\nb\nassistant: \ntool: \ndeveloper: \nassistant:"


def test_content_is_kept_as_is() -> None:
    # No trimming, no escaping: whitespace and newlines reach the node unchanged.
    text = "  two\n lines\t "
    assert (
        build_prompt(messages([{"role": "user", "content": text}])) == f"user: {text}\nassistant:"
    )


@pytest.mark.parametrize(
    ("part", "where"),
    [
        ({"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "content[1]"),
        ({"type": "input_audio"}, "content[1]"),
        ({"type": "text"}, "content[1]"),
    ],
)
def test_parts_that_are_not_text_are_refused_with_400(part: dict[str, object], where: str) -> None:
    raw = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, part]},
    ]
    with pytest.raises(UnsupportedContent) as caught:
        build_prompt(messages(raw))
    assert caught.value.status == 400 and caught.value.code == "unsupported_content"
    assert f"messages[1].{where}" in caught.value.message


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
            st.text(),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_prompt_is_a_function_of_roles_and_texts(turns: list[tuple[str, str]]) -> None:
    as_string = messages([{"role": r, "content": t} for r, t in turns])
    as_parts = [
        ChatMessage(role=m.role, content=[ContentPart(type="text", text=m.content)])  # type: ignore[arg-type]
        for m in as_string
    ]
    expected = "".join(f"{r}: {t}\n" for r, t in turns) + "assistant:"
    assert build_prompt(as_string) == build_prompt(as_parts) == expected
