"""The ids a log line carries (instance, task, node, request), held in context variables.

They are set where a request, a task or a node connection is handled, so every log call made
there (and in the tasks it starts: trio copies the context into child tasks) carries them
without passing them around. The variables themselves live in ``protocol/log_lines/ids.py``:
the node agent binds its node id into the same ones (``gemmanet node`` logs through the
coordinator's handler) and must not import the coordinator. This module is the coordinator's
name for them.
"""

from __future__ import annotations

from protocol.log_lines.ids import (
    LOG_IDS,
    bind_log_ids,
    current_log_ids,
    instance_id_var,
    node_id_var,
    request_id_var,
    task_id_var,
)

__all__ = [
    "LOG_IDS",
    "bind_log_ids",
    "current_log_ids",
    "instance_id_var",
    "node_id_var",
    "request_id_var",
    "task_id_var",
]
