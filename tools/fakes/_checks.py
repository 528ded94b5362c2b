"""Checking a request body against a client library's own pydantic types, strictly: no key the
types do not name, no value of another type (no "3" for 3), every element of an ``Iterable``
field looked at (pydantic checks those lazily, as they are iterated).

The fakes import this (and the libraries) only when a generation request comes, so a fake that
only answers ``/api/ps`` needs no test dependency.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError

__all__ = ["Problem", "check_model", "check_typed"]

M = TypeVar("M", bound=BaseModel)
_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")


class Problem(Exception):
    """The body is not what the library would send: ``kind`` (pydantic's error type) says
    how, ``loc`` where (``messages.0.role``), ``detail`` what; ``message`` all of it."""

    def __init__(self, kind: str, loc: str, detail: str) -> None:
        self.kind = kind
        self.loc = loc
        self.detail = detail
        self.message = f"{loc}: {detail}" if loc else detail
        super().__init__(self.message)


def check_model(model: type[M], body: object) -> M:
    """``body`` as ``model`` (a pydantic model whose config forbids extra keys)."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as exc:
        raise _problem(exc.errors(), ()) from None


def check_typed(adapter: TypeAdapter[Any], body: object) -> dict[str, Any]:
    """``body`` as the TypedDict of ``adapter``, its lazily checked iterables walked."""
    try:
        value = adapter.validate_python(body, strict=True)
    except ValidationError as exc:
        raise _problem(exc.errors(), ()) from None
    walked = _walk(value, ())
    assert isinstance(walked, dict)
    return walked


def _walk(value: Any, path: tuple[str | int, ...]) -> Any:
    if isinstance(value, dict):
        return {key: _walk(item, (*path, key)) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_walk(item, (*path, index)) for index, item in enumerate(value)]
    if isinstance(value, Iterator):
        items = []
        try:
            for index, item in enumerate(value):
                items.append(_walk(item, (*path, index)))
        except ValidationError as exc:
            # The iterator's errors start at the element: ``path`` says where it is.
            raise _problem(exc.errors(), path) from None
        return items
    return value


def _problem(errors: list[Any], prefix: tuple[str | int, ...]) -> Problem:
    error = _relevant(errors)
    loc = ".".join(str(p) for p in (*prefix, *error["loc"]) if _named(p))
    return Problem(error["type"], loc, error["msg"])


def _relevant(errors: list[Any]) -> Any:
    """The error that says what is wrong: of a union (one message type per role), the error
    of the member whose ``role`` / ``type`` matched, not of every member it is not."""
    other_kinds = [
        tuple(e["loc"][:-1])
        for e in errors
        if e["type"] == "literal_error" and e["loc"] and e["loc"][-1] in ("role", "type")
    ]
    relevant = [e for e in errors if not any(tuple(e["loc"][: len(k)]) == k for k in other_kinds)]
    return (relevant or errors)[0]


def _named(part: object) -> bool:
    # Pydantic puts the union member's name in the location (ChatCompletionUserMessageParam,
    # literal['','json']): not a field of the body.
    return isinstance(part, int) or (isinstance(part, str) and bool(_FIELD.match(part)))
