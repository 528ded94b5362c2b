"""Driver failures mapped to the store's error hierarchy (``coordinator.errors``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import sqlalchemy as sa

from .errors import StoreError, StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")


def translate_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """Map driver failures to the store's hierarchy; errors already ours pass through."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except StoreError:
            raise
        except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
            raise StoreUnavailable(f"database unavailable: {_reason(exc)}") from exc
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"database error: {_reason(exc)}") from exc

    return wrapper


def _reason(exc: sa.exc.SQLAlchemyError) -> str:
    # The driver's message only; SQLAlchemy's own str() would append the statement parameters,
    # which include secret digests and should not end up in logs.
    orig = getattr(exc, "orig", None)
    return str(orig if orig is not None else exc.__class__.__name__).strip().splitlines()[0]
