"""The HTTP API of one real coordinator process with real node agent processes."""

from __future__ import annotations

import json

import httpx
import pytest

from coordinator.settings import Settings
from tests.fixtures.processes import Coordinator, Processes

pytestmark = pytest.mark.e2e


@pytest.fixture
def setup(procs: Processes) -> tuple[Processes, Coordinator, str]:
    coord = procs.coordinator()
    procs.node(coord, "echo-1")
    return procs, coord, procs.create_key("client")


def sse_events(response: httpx.Response) -> list[dict[str, object]]:
    events = []
    for block in response.text.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(json.loads(block[len("data: ") :]))
    return events


def test_request_returns_the_echo(setup) -> None:
    _, coord, key = setup
    response = coord.request(key, model="echo", prompt="hello  wide world ")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["output"] == "hello  wide world "
    assert body["node_id"] == "echo-1" and body["task_id"]


def test_streaming_chunks_join_to_the_prompt(setup) -> None:
    _, coord, key = setup
    prompt = " leading space, then words\tand tabs "
    response = coord.request(key, model="echo", prompt=prompt, stream=True)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    deltas = [e["delta"] for e in events[:-1]]
    assert len(deltas) > 3 and "".join(deltas) == prompt  # type: ignore[arg-type]
    done = events[-1]
    assert done["done"] is True and done["output"] == prompt and done["node_id"] == "echo-1"


def test_rating_lifecycle(setup) -> None:
    procs, coord, key = setup
    task_id = coord.request(key, model="echo", prompt="rate me").json()["task_id"]
    auth = {"Authorization": f"Bearer {key}"}
    url = f"/api/v1/tasks/{task_id}/rating"
    for bad in (0, 6, "5", 4.5, None):
        r = coord.http.post(url, json={"score": bad}, headers=auth)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
    other = procs.create_key("other")
    r = coord.http.post(url, json={"score": 4}, headers={"Authorization": f"Bearer {other}"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = coord.http.post(url, json={"score": 4}, headers=auth)
    assert r.status_code == 200 and r.json() == {"task_id": task_id, "score": 4}
    # At once on the instance that took it (the periodic refresh is 15 s away).
    (node,) = coord.nodes()
    assert node["rating"] == 4 and node["ratings"] == 1, node
    r = coord.http.post(url, json={"score": 5}, headers=auth)
    assert r.status_code == 409 and r.json()["error"]["code"] == "already_rated"
    r = coord.http.post("/api/v1/tasks/t-nope/rating", json={"score": 5}, headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "task_not_found"


def test_streamed_task_can_be_rated_right_after_done(setup) -> None:
    _, coord, key = setup
    done = sse_events(coord.request(key, model="echo", prompt="a b c", stream=True))[-1]
    r = coord.http.post(
        f"/api/v1/tasks/{done['task_id']}/rating",
        json={"score": 5},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200


def test_status_nodes_healthz(setup) -> None:
    _, coord, key = setup
    assert coord.http.get("/healthz").json() == {"ok": True}
    status = coord.status()
    assert status["online_nodes"] == 1 and status["instances"] == 1 and status["in_flight"] == 0
    assert isinstance(status["version"], str)
    assert coord.http.get("/api/v1/nodes").status_code == 401
    nodes = coord.http.get("/api/v1/nodes", headers={"Authorization": f"Bearer {key}"}).json()
    [node] = nodes["nodes"]
    assert node["node_id"] == "echo-1" and node["models"] == ["echo"] and node["instance_id"]


def test_errors_are_json_with_the_interface_statuses(setup) -> None:
    _, coord, key = setup
    auth = {"Authorization": f"Bearer {key}"}
    cases = [
        ({}, b'{"model": "echo", "prompt": "x"}', 401, "unauthorized"),
        (
            {"Authorization": "Bearer gn_unknown"},
            b'{"model":"echo","prompt":"x"}',
            401,
            "unauthorized",
        ),
        (auth, b'{"model": "echo", "prompt": ', 400, "malformed_json"),
        (auth, b"", 400, "malformed_json"),
        (auth, b'{"prompt": "no model"}', 422, "invalid_request"),
        (auth, b'{"model": "echo", "prompt": "x", "stream": "yes"}', 422, "invalid_request"),
        (auth, b'{"model": "echo", "prompt": "x", "timeout_s": -1}', 422, "invalid_request"),
        (auth, b'["model", "echo"]', 422, "invalid_request"),
        (
            auth,
            b'{"model": "echo", "prompt": "' + b"x" * (Settings.max_body_bytes + 10) + b'"}',
            413,
            "payload_too_large",
        ),
    ]
    for headers, body, status, code in cases:
        r = coord.http.post("/api/v1/request", content=body, headers=headers)
        assert r.status_code == status, (body[:60], r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["message"]
    r = coord.http.get("/no/such/thing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = coord.http.get("/api/v1/request")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_the_root_points_to_the_docs_and_the_health_routes(setup) -> None:
    _, coord, _ = setup
    for accept in (None, "*/*", "application/json"):
        r = coord.http.get("/", headers={"Accept": accept} if accept else {})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["links"] == {
            "openapi": "/openapi.json",
            "system_health": "/system-health",
            "healthz": "/healthz",
            "readyz": "/readyz",
            "status": "/api/v1/status",
        }
        assert "docs/interface.md" in body["docs"] and body["version"] == coord.status()["version"]
    # A browser asks for HTML first: the same, as links.
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    page = coord.http.get("/", headers={"Accept": browser})
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for path in ("/openapi.json", "/system-health", "/healthz", "/api/v1/status"):
        assert f'href="{path}"' in page.text, path
    for path in (body["links"]["openapi"], body["links"]["healthz"], body["links"]["readyz"]):
        assert coord.http.get(path).status_code == 200, path


def test_a_key_without_bearer_is_told_the_header_shape(setup) -> None:
    _, coord, key = setup
    for header in (key, f"Token {key}", "Bearer", f"Basic {key}"):
        r = coord.http.get("/api/v1/nodes", headers={"Authorization": header})
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
        message = r.json()["error"]["message"]
        assert message.startswith("the Authorization header must be 'Bearer <key>'"), message
        assert key not in r.text  # what was sent is not echoed
    r = coord.http.get("/api/v1/nodes")
    assert r.json()["error"]["message"] == "missing API key: send 'Authorization: Bearer <key>'"


def test_an_unknown_task_is_named_in_its_404(setup) -> None:
    _, coord, key = setup
    r = coord.http.post(
        "/api/v1/tasks/t-nope/rating",
        json={"score": 5},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 404, r.text
    assert r.json()["error"] == {"code": "task_not_found", "message": "no task with id t-nope"}


def test_the_cluster_view_shows_no_model_to_a_plain_key(setup) -> None:
    procs, coord, key = setup
    operator = procs.create_key("ops", admin=True)

    def cluster(api_key: str) -> dict[str, object]:
        r = coord.http.get("/api/v1/cluster", headers={"Authorization": f"Bearer {api_key}"})
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    full = cluster(operator)
    assert full["admin"] is True and full["queued"] == {"echo": 0} and full["queue_depth"] == 0
    plain = cluster(key)
    assert plain["admin"] is False and plain["nodes"] is None and plain["queued"] is None
    assert plain["queue_depth"] == 0 and plain["online_nodes"] == 1
    text = coord.http.get("/api/v1/cluster", headers={"Authorization": f"Bearer {key}"}).text
    assert "echo" not in text and "echo-1" not in text, text


def test_unserved_model_is_503_at_once(setup) -> None:
    _, coord, key = setup
    r = coord.request(key, model="no-such-model", prompt="x")
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_node_for_model"
    assert int(r.headers["Retry-After"]) >= 1


def test_rate_limit_is_429_with_retry_after(procs: Processes) -> None:
    coord = procs.coordinator(GEMMANET_RATE_LIMIT="3/minute")
    procs.node(coord, "echo-rl")
    key = procs.create_key("limited")
    responses = [coord.request(key, model="echo", prompt="x") for _ in range(5)]
    statuses = [r.status_code for r in responses]
    assert statuses == [200, 200, 200, 429, 429], [r.text for r in responses]
    r = coord.request(key, model="echo", prompt="x")
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.json()["error"]["code"] == "rate_limited"
    # Another key has its own budget.
    assert coord.request(procs.create_key("other"), model="echo", prompt="x").status_code == 200


def test_timeout_is_504(procs: Processes) -> None:
    coord = procs.coordinator()
    procs.node(coord, "slow", extra=("--latency-ms", "5000"))
    key = procs.create_key("client")
    r = coord.request(key, model="echo", prompt="x", timeout_s=0.5)
    assert r.status_code == 504 and r.json()["error"]["code"] == "task_timeout"
    # The node's slot was freed by the cancel: a second request is placed, not refused busy.
    r = coord.request(key, model="echo", prompt="y", timeout_s=0.5)
    assert r.status_code == 504


def test_openapi_document_lists_the_api(setup) -> None:
    _, coord, _ = setup
    doc = coord.http.get("/openapi.json").json()
    assert {"/api/v1/request", "/api/v1/status", "/api/v1/nodes"} <= set(doc["paths"])
    request_schema = json.dumps(doc)
    assert "prompt" in request_schema and "timeout_s" in request_schema
