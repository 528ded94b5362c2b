"""The log lines about one task, each carrying its task and node ids (``extra=``): they are
written from whatever task happens to carry out the step (a request's, the bus reader's, a node
socket's), whose context may be another task's or none."""

from __future__ import annotations

import logging

from protocol import Assign, Error

log = logging.getLogger("gemmanet.instance")


def task_placed(task_id: str, node_id: str, owner: str) -> None:
    log.debug(
        "task %s placed on node %s of instance %s",
        task_id,
        node_id,
        owner,
        extra={"task_id": task_id, "node_id": node_id},
    )


def task_sent(assign: Assign, node_id: str | None, conn_id: str) -> None:
    """On the owner's side: the assign may have come over the bus for another instance."""
    log.debug(
        "task %s sent to node %s (%s)",
        assign.task_id,
        node_id,
        conn_id,
        extra={"task_id": assign.task_id, "node_id": node_id},
    )


def task_failed_on_node(error: Error, node_id: str) -> None:
    log.info(
        "task %s failed on node %s: %s: %s",
        error.task_id,
        node_id,
        error.code,
        error.message,
        extra={"task_id": error.task_id, "node_id": node_id},
    )


def task_ended(task_id: str, node_id: str, outcome: str) -> None:
    """A failure is worth a line at INFO; a success only at debug (one per request)."""
    log.log(
        logging.DEBUG if outcome == "ok" else logging.INFO,
        "task %s ended: %s",
        task_id,
        outcome,
        extra={"task_id": task_id, "node_id": node_id},
    )
