"""The simulated clients: each sends requests to a live instance at random (some streamed, every
other one a conversation, some given up before their answer) and the trace records what each
request got."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import trio

from coordinator.errors import GemmaNetError
from coordinator.runtime.instance import Instance
from protocol import Message, transcript
from sim.trace import Trace

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta")


def key_weight(key: str) -> int:
    """The priority of a simulated client's key ``key-N``: 1, 2 or 3 (N modulo 3, plus 1)."""
    return 1 + int(key.rsplit("-", 1)[1]) % 3


class Target(Protocol):
    """What a client needs of a simulated instance (``world.SimInstance``)."""

    name: str
    instance: Instance
    nursery: trio.Nursery | None


class Clients:
    """The clients of one run, and the count of their requests and outcomes."""

    def __init__(
        self,
        seed: int,
        *,
        request_interval_s: float,
        stream_fraction: float,
        trace: Trace,
        instances: Mapping[str, Target],
        live: Callable[[], list[str]],
        walk_away_chance: Callable[[], float],
    ) -> None:
        self.seed = seed
        self.request_interval_s = request_interval_s
        self.stream_fraction = stream_fraction
        self.trace = trace
        self.instances = instances
        self.live = live
        # The fault plan's chance that a client gives up on a request before its answer.
        self.walk_away_chance = walk_away_chance
        #: while set, the clients keep sending
        self.sending = True
        #: requests sent and not ended yet
        self.open = 0
        #: requests sent so far
        self.count = 0
        #: requests per outcome ("ok", an error code, "client_gone", "connection_lost")
        self.outcomes: dict[str, int] = {}

    async def client(self, number: int) -> None:
        rng = random.Random(f"{self.seed}:client:{number}")
        key = f"key-{number}"
        while self.sending:
            await trio.sleep(rng.expovariate(1 / self.request_interval_s))
            live = self.live()
            if not live or not self.sending:
                continue
            sim = self.instances[rng.choice(live)]
            self.count += 1
            rid = f"r{self.count}"
            prompt = " ".join([rid] + [rng.choice(WORDS) for _ in range(rng.randint(0, 5))])
            stream = rng.random() < self.stream_fraction
            # Every other request is a conversation: a v2 node gets it as messages, a v1 node as
            # the transcript, and both echo the transcript.
            conversation = self.count % 2 == 0
            model = rng.choice(["m1", "m2", "m3"])
            walk_away = rng.uniform(0.05, 2.0) if rng.random() < self.walk_away_chance() else None
            assert sim.nursery is not None
            self.open += 1
            self.trace.emit(
                "request.start",
                rid=rid,
                instance=sim.name,
                prompt=prompt,
                expect=transcript([Message(role="user", content=prompt)])
                if conversation
                else prompt,
                stream=stream,
                model=model,
            )
            sim.nursery.start_soon(
                self._request, sim, key, rid, prompt, conversation, model, stream, walk_away
            )

    async def _request(
        self,
        sim: Target,
        key: str,
        rid: str,
        prompt: str,
        conversation: bool,
        model: str,
        stream: bool,
        walk_away: float | None,
    ) -> None:
        instance = sim.instance
        ended, task = False, None

        def end(outcome: str, **fields: Any) -> None:
            nonlocal ended
            ended = True
            self.open -= 1
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self.trace.emit("request.end", rid=rid, outcome=outcome, task=task, **fields)

        try:
            with trio.CancelScope() as client_scope:
                if walk_away is not None:
                    client_scope.deadline = trio.current_time() + walk_away
                try:
                    await instance.requests.check_rate_limit(key)
                    # Its priority, as an authenticated request brings it: 1-3 by client.
                    instance.admissions.note_key(key, key, key_weight(key))
                    limit, period = instance.settings.rate_limit
                    self.trace.emit("ratelimit.allowed", key=key, limit=limit, period=period)
                    content: dict[str, Any] = (
                        {"messages": [Message(role="user", content=prompt)]}
                        if conversation
                        else {"prompt": prompt}
                    )
                    async with instance.requests.open(
                        key_id=key, model=model, stream=stream, timeout_s=None, **content
                    ) as handle:
                        task = handle.task_id
                        self.trace.emit(
                            "request.placed",
                            rid=rid,
                            task=task,
                            instance=sim.name,
                            node=handle.node_id,
                        )
                        done = await handle.result()
                    usage = done.usage
                    end(
                        "ok",
                        node=handle.node_id,
                        output=done.output,
                        completion_tokens=None if usage is None else usage.completion_tokens,
                    )
                except GemmaNetError as exc:
                    end(exc.code)
            if client_scope.cancelled_caught and not ended:
                end("client_gone")
        finally:
            if not ended:  # the instance crashed under the request: its connection dropped
                end("connection_lost")
