"""Request and response bodies. Requests are decoded strictly with msgspec; the same Structs
document the API in /openapi.json."""

from __future__ import annotations

from typing import Annotated

import msgspec

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class TaskRequest(msgspec.Struct, kw_only=True):
    model: ModelName
    prompt: str
    stream: bool = False
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] | None = None


class TaskResponse(msgspec.Struct, kw_only=True):
    task_id: str
    node_id: str
    output: str


class RatingRequest(msgspec.Struct, kw_only=True):
    score: Annotated[int, msgspec.Meta(ge=1, le=5)]


class RatingResponse(msgspec.Struct, kw_only=True):
    task_id: str
    score: int


class StatusResponse(msgspec.Struct, kw_only=True):
    online_nodes: int
    instances: int
    in_flight: int
    version: str


class NodeInfo(msgspec.Struct, kw_only=True):
    node_id: str
    instance_id: str
    models: list[str]
    max_parallel: int
    in_flight: int
    vram_gb: float | None = None
    rating: float | None = None
    ratings: int = 0
    agent_version: str = ""
    connected_at: float | None = None


class NodesResponse(msgspec.Struct, kw_only=True):
    nodes: list[NodeInfo]


class ErrorDetail(msgspec.Struct, kw_only=True):
    code: str
    message: str


class ErrorResponse(msgspec.Struct, kw_only=True):
    error: ErrorDetail
