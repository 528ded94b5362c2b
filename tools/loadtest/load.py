"""The load of one phase: a closed-loop ramp, an open-loop steady rate, streams alongside, and
(with several instances) ``kill -9`` of one instance followed by more steady load.

Timeline, from the load's start ``t0`` (all times ``time.monotonic()``):

* ramp: ``concurrency`` closed-loop workers start evenly over ``ramp_s`` and run until
  ``hold_end = t0 + ramp_s + hold_s``, so ``concurrency`` requests are in flight during the hold.
* streams: ``streams`` closed-loop workers start evenly over the ramp and keep one stream each
  open until the load stops.
* steady: from ``hold_end`` one request every ``1/rate`` s (open loop: sent on schedule whatever
  the answers do; latency is taken from the scheduled time, so a stall counts against every
  request scheduled during it) until ``steady_end = hold_end + duration_s``.
* fault (several instances only): at ``steady_end`` the instance with the most in-flight tasks
  requested elsewhere is killed with SIGKILL (waiting up to a few seconds for one to have any),
  the client side stops sending to it (as a load balancer would), and the open loop goes on for
  ``fault_s``.

Then nothing new is sent; what is in flight gets ``client_timeout_s`` to answer. Every request
ends as ``ok`` (200 with its prompt echoed back), ``error`` (an explicit error: an error status,
an error event in a stream, or the connection of a killed instance dropping, which a load
balancer would turn into a 502) or ``lost`` (no answer at all: timeout, a live instance dropping
the connection, a stream ending without its final event).
"""

from __future__ import annotations

import json
import math
import os
import signal
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import trio

from tools.bench._harness import error_label
from tools.loadtest.journal import JournalReader
from tools.loadtest.profile import MODEL, Profile

VICTIM_WAIT_S = 5.0
RETRY_PAUSE_S = 0.1
_TEXT = "the quick brown fox jumps over the lazy dog while gemma nodes answer every request"
_WORDS = tuple(_TEXT.split(" "))


@dataclass(slots=True)
class Rec:
    """One request and what became of it (monotonic times; NaN = did not happen)."""

    tag: str
    kind: str  # "ramp" | "steady" | "stream"
    inst: int  # index of the instance it was sent to
    sched: float
    sent: float = math.nan
    first: float = math.nan  # streams: the first delta
    done: float = math.nan
    outcome: str = ""  # "ok" | "error" | "lost"
    label: str = ""
    status: int = 0  # HTTP status, or the status inside a stream's error event
    chunks: int = 0
    message: str = ""  # of an error


def prompt_for(tag: str, words: int) -> str:
    body = [_WORDS[(len(tag) + i) % len(_WORDS)] for i in range(max(0, words - 1))]
    return " ".join([tag, *body])


class Load:
    def __init__(
        self,
        profile: Profile,
        urls: list[str],
        request_keys: list[str],
        stream_keys: list[str],
        journal: JournalReader,
        pids: list[int],
        *,
        kill: bool,
    ) -> None:
        self.profile = profile
        self.urls = urls
        self.request_keys = request_keys
        self.stream_keys = stream_keys
        self.journal = journal
        self.pids = pids
        self.kill_enabled = kill and len(urls) > 1
        self.records: list[Rec] = []
        self.alive = list(range(len(urls)))
        self.killed: int | None = None
        self.kill_t = math.nan
        self.kill_info: dict[str, Any] = {}
        self.t0 = math.nan
        self.hold_end = math.nan
        self.steady_end = math.nan
        self.stop_at = math.inf
        self.ended = math.nan
        self.in_flight = 0
        self.max_in_flight = 0
        self.ramp_in_flight = 0
        self.max_ramp_in_flight = 0
        self._counter = 0
        self._rr = 0
        # One HTTP client (connection pool) per API key and instance, as separate clients would
        # have: one shared pool with hundreds of connections costs the load generator far more
        # CPU per request (it became the bottleneck of the single-instance phase).
        self._clients: dict[tuple[str, int], httpx.AsyncClient] = {}
        # Only plain http to loopback, but every client would load the CA bundle anew.
        self._tls = ssl.create_default_context()
        #: the first few error messages of each error label (for the report)
        self.messages: dict[str, list[str]] = {}

    # -- helpers ------------------------------------------------------------------------------

    def _next_tag(self, prefix: str) -> str:
        self._counter += 1
        return f"{prefix}{self._counter}"

    def _pick_instance(self) -> int:
        self._rr += 1
        return self.alive[self._rr % len(self.alive)]

    @staticmethod
    async def _sleep_until(when: float) -> None:
        delay = when - time.monotonic()
        if delay > 0:
            await trio.sleep(delay)

    def _client(self, key: str, inst: int) -> httpx.AsyncClient:
        client = self._clients.get((key, inst))
        if client is None:
            client = self._clients[key, inst] = httpx.AsyncClient(
                base_url=self.urls[inst],
                headers={"Authorization": f"Bearer {key}"},
                timeout=httpx.Timeout(self.profile.client_timeout_s, connect=5.0),
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                verify=self._tls,
            )
        return client

    def _note(self, rec: Rec, message: str) -> None:
        rec.message = message[:300]
        seen = self.messages.setdefault(rec.label, [])
        if len(seen) < 3 and rec.message not in seen:
            seen.append(rec.message)

    def _error_response(self, rec: Rec, response: httpx.Response) -> None:
        rec.outcome, rec.label = "error", error_label(response)
        try:
            self._note(rec, str(response.json()["error"]["message"]))
        except Exception:  # noqa: BLE001 - not our error shape: keep the start of the body
            self._note(rec, response.text[:200])

    def _transport_error(self, rec: Rec, exc: BaseException) -> None:
        rec.done = time.monotonic()
        if rec.inst == self.killed and rec.done >= self.kill_t - 0.05:
            rec.outcome, rec.label = "error", "connection lost: instance killed (LB 502)"
        else:
            rec.outcome, rec.label = "lost", f"transport error {type(exc).__name__}"
        self._note(rec, f"{type(exc).__name__}: {exc}")

    # -- one request --------------------------------------------------------------------------

    async def _request(self, rec: Rec, key: str) -> None:
        prompt = prompt_for(rec.tag, 3)
        client = self._client(key, rec.inst)
        self.records.append(rec)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        rec.sent = time.monotonic()
        try:
            with trio.move_on_after(self.profile.client_timeout_s) as scope:
                try:
                    response = await client.post(
                        "/api/v1/request",
                        json={"model": MODEL, "prompt": prompt},
                    )
                except httpx.TransportError as exc:
                    self._transport_error(rec, exc)
                    return
                rec.done = time.monotonic()
                rec.status = response.status_code
                if response.status_code == 200:
                    try:
                        output = response.json().get("output")
                    except ValueError:
                        output = None
                    if output == prompt:
                        rec.outcome, rec.label = "ok", "200"
                    else:
                        rec.outcome, rec.label = "error", "200 wrong output"
                else:
                    self._error_response(rec, response)
            if scope.cancelled_caught:
                rec.outcome = "lost"
                rec.label = f"no answer within {self.profile.client_timeout_s:g} s"
        finally:
            self.in_flight -= 1

    async def _stream(self, rec: Rec, key: str) -> None:
        prompt = prompt_for(rec.tag, self.profile.stream_words)
        client = self._client(key, rec.inst)
        self.records.append(rec)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        rec.sent = time.monotonic()
        deltas: list[str] = []
        try:
            with trio.move_on_after(self.profile.client_timeout_s) as scope:
                try:
                    async with client.stream(
                        "POST",
                        "/api/v1/request",
                        json={"model": MODEL, "prompt": prompt, "stream": True},
                    ) as response:
                        rec.status = response.status_code
                        if response.status_code != 200:
                            await response.aread()
                            rec.done = time.monotonic()
                            self._error_response(rec, response)
                            return
                        async for line in response.aiter_lines():
                            if not line.startswith("data:"):
                                continue
                            event = json.loads(line[5:])
                            if "delta" in event:
                                if not deltas:
                                    rec.first = time.monotonic()
                                deltas.append(event["delta"])
                                rec.chunks += 1
                            elif event.get("done"):
                                rec.done = time.monotonic()
                                good = event.get("output") == prompt and "".join(deltas) == prompt
                                rec.outcome = "ok" if good else "error"
                                rec.label = "200" if good else "200 wrong stream output"
                                return
                            elif "error" in event:
                                rec.done = time.monotonic()
                                error = event["error"]
                                rec.status = int(error.get("status", 0) or 0)
                                rec.outcome = "error"
                                rec.label = f"stream error {rec.status} {error.get('code', '?')}"
                                self._note(rec, str(error.get("message", "")))
                                return
                    rec.done = time.monotonic()
                    rec.outcome, rec.label = "lost", "stream ended without its final event"
                except httpx.TransportError as exc:
                    self._transport_error(rec, exc)
                except ValueError:
                    rec.done = time.monotonic()
                    rec.outcome, rec.label = "lost", "stream event is not JSON"
            if scope.cancelled_caught:
                rec.outcome = "lost"
                rec.label = f"no end of stream within {self.profile.client_timeout_s:g} s"
        finally:
            self.in_flight -= 1

    # -- drivers ------------------------------------------------------------------------------

    async def _ramp_worker(self, w: int) -> None:
        p = self.profile
        await self._sleep_until(self.t0 + p.ramp_s * w / p.concurrency)
        key = self.request_keys[w % len(self.request_keys)]
        while time.monotonic() < self.hold_end:
            now = time.monotonic()
            rec = Rec(self._next_tag("r"), "ramp", self._pick_instance(), now)
            self.ramp_in_flight += 1
            self.max_ramp_in_flight = max(self.max_ramp_in_flight, self.ramp_in_flight)
            try:
                await self._request(rec, key)
            finally:
                self.ramp_in_flight -= 1
            if rec.outcome != "ok":
                await trio.sleep(RETRY_PAUSE_S)

    async def _stream_worker(self, s: int) -> None:
        p = self.profile
        spread = p.ramp_s if p.ramp_s > 0 else p.stream_s
        await self._sleep_until(self.t0 + spread * s / max(1, p.streams))
        key = self.stream_keys[s % len(self.stream_keys)]
        while time.monotonic() < self.stop_at:
            now = time.monotonic()
            rec = Rec(self._next_tag("s"), "stream", self._pick_instance(), now)
            await self._stream(rec, key)
            if rec.outcome != "ok":
                await trio.sleep(RETRY_PAUSE_S)

    async def _open_loop(self, nursery: trio.Nursery) -> None:
        p = self.profile
        i = 0
        while True:
            scheduled = self.hold_end + i / p.rate
            if scheduled >= self.stop_at:
                break
            await self._sleep_until(scheduled)
            if scheduled >= self.stop_at:
                break
            rec = Rec(self._next_tag("q"), "steady", self._pick_instance(), scheduled)
            nursery.start_soon(self._request, rec, self.request_keys[i % len(self.request_keys)])
            i += 1

    def choose_victim(self) -> tuple[int, int]:
        """The instance with the most in-flight tasks requested on another instance (so the
        fail-fast path is exercised), and that count."""
        self.journal.poll()
        counts = dict.fromkeys(self.alive, 0)
        for rec in self.records:
            if not math.isnan(rec.done):
                continue
            where = self.journal.assigned.get(rec.tag)
            if where is not None and where.instance in counts and where.instance != rec.inst:
                counts[where.instance] += 1
        victim = max(sorted(counts, reverse=True), key=lambda k: counts[k])
        return victim, counts[victim]

    async def _killer(self, on_kill: Callable[[int, float], None] | None) -> None:
        p = self.profile
        await self._sleep_until(self.steady_end)
        if not self.kill_enabled:
            self.stop_at = self.steady_end
            return
        give_up = time.monotonic() + VICTIM_WAIT_S
        while True:
            victim, count = self.choose_victim()
            if count > 0 or time.monotonic() >= give_up:
                break
            await trio.sleep(0.1)
        os.kill(self.pids[victim], signal.SIGKILL)
        self.kill_t = time.monotonic()
        self.killed = victim
        self.alive.remove(victim)
        self.stop_at = self.kill_t + p.fault_s
        self.kill_info = {
            "instance": victim,
            "waited_for_victim_s": self.kill_t - self.steady_end,
            "cross_instance_tasks_in_flight_seen": count,
        }
        if on_kill is not None:
            on_kill(victim, self.kill_t)

    async def run(self, on_kill: Callable[[int, float], None] | None = None) -> None:
        p = self.profile
        try:
            self.t0 = time.monotonic() + 0.1
            self.hold_end = self.t0 + p.ramp_s + p.hold_s
            self.steady_end = self.hold_end + p.duration_s
            if not self.kill_enabled:
                self.stop_at = self.steady_end
            # Everything is bounded: the last request starts before stop_at and ends within
            # client_timeout_s; the outer deadline is only a safety net.
            with trio.move_on_after(
                p.ramp_s
                + p.hold_s
                + p.duration_s
                + VICTIM_WAIT_S
                + p.fault_s
                + 3 * p.client_timeout_s
                + 30
            ):
                async with trio.open_nursery() as nursery:
                    for w in range(p.concurrency):
                        nursery.start_soon(self._ramp_worker, w)
                    for s in range(p.streams):
                        nursery.start_soon(self._stream_worker, s)
                    nursery.start_soon(self._killer, on_kill)
                    await self._sleep_until(self.hold_end)
                    await self._open_loop(nursery)
            self.ended = time.monotonic()
            for rec in self.records:
                if not rec.outcome:
                    rec.outcome, rec.label = "lost", "unfinished when the load test gave up"
        finally:
            with trio.CancelScope(shield=True):
                for client in self._clients.values():
                    await client.aclose()
