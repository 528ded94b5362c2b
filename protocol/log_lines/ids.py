"""The ids a log line carries (instance, task, node, request), held in context variables.

They are set where a request, a task or a node connection is handled, so every log call made
there (and in the tasks it starts: trio copies the context into child tasks) carries them
without passing them around. The JSON formatter (``formats.JsonFormatter``) reads them when it
formats a line; a call about something else than the current context passes
``extra={"task_id": ...}`` itself, and an explicit ``extra`` wins. One set of variables for the
coordinator and the node agent: ``gemmanet node`` runs the agent under the coordinator's log
handler, which must see the node id the agent binds.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = [
    "LOG_IDS",
    "bind_log_ids",
    "current_log_ids",
    "instance_id_var",
    "node_id_var",
    "request_id_var",
    "task_id_var",
]

LOG_IDS = ("instance_id", "task_id", "node_id", "request_id")

instance_id_var: ContextVar[str | None] = ContextVar("gemmanet_instance_id", default=None)
task_id_var: ContextVar[str | None] = ContextVar("gemmanet_task_id", default=None)
node_id_var: ContextVar[str | None] = ContextVar("gemmanet_node_id", default=None)
request_id_var: ContextVar[str | None] = ContextVar("gemmanet_request_id", default=None)

_VARS: dict[str, ContextVar[str | None]] = {
    "instance_id": instance_id_var,
    "task_id": task_id_var,
    "node_id": node_id_var,
    "request_id": request_id_var,
}


def bind_log_ids(**ids: str | None) -> None:
    """Set ids for the rest of the current task (and the tasks it starts from now on).

    Unknown names are a programming error (KeyError); ``None`` clears an id."""
    for name, value in ids.items():
        _VARS[name].set(value)


def current_log_ids() -> dict[str, str]:
    """The ids set in the current context, without the unset ones."""
    found: dict[str, str] = {}
    for name, var in _VARS.items():
        value = var.get()
        if value is not None:
            found[name] = value
    return found
