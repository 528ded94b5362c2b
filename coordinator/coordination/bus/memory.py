"""The instance bus in one process: the embedded mode, tests and the simulator.

Two layers, like memory.py:

* ``MemoryBusHub`` (memory_bus_hub.py) — plain synchronous state shared by every ``MemoryBus`` of
  one process (one per simulated instance): pub/sub listeners, and the durable inboxes with
  their presence, on an injected clock.
* ``MemoryBus`` — the async ``Bus`` facade. Each call checkpoints once, then runs one hub method
  synchronously, which makes it atomic.

``MemoryBus(durable=False)`` behaves like ``PubSubBus`` over Redis pub/sub: at-most-once, ``send``
returns how many listeners are open, nothing is kept for a closed inbox, and a listener whose
buffer is full loses the message. ``MemoryBus(durable=True)`` imitates ``StreamsBus`` (see
bus/streams.py): a presence with a ``presence_ttl_s`` TTL, set when a listen opens and refreshed
every ``refresh_s`` while it is open; ``send`` appends only while the presence exists (1, else
0); ``is_listening`` reads the presence; the inbox keeps at most ``maxlen`` entries and vanishes
``retention_s`` after the last send or refresh. A listen that is *lost* — its iterator raised
``CoordinationUnavailable`` (see ``drop``), or the block was left by that error — leaves the
presence to expire by itself, so what is sent until then waits, and the next ``listen`` of the
same ``MemoryBus`` object continues after the last entry it delivered; it is ``resumed`` when no
envelope was refused for want of a presence since the lost listen began (the hub counts them,
as StreamsBus records them) and nothing was trimmed. A refusal while a listen is open (its
presence lapsed: a refresh held up for a TTL) cuts it like ``drop``. A listen closed any other
way withdraws the presence at once. (StreamsBus's tolerance of a Redis stall has no
counterpart here: a refusal is always believed.) Entry ids count up across the hub and never
repeat, so unlike Redis after a restart, an inbox that expired and came back has only newer ids.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from types import TracebackType

import trio

from coordinator.coordination.base import CoordinationUnavailable, Subscription
from coordinator.coordination.bus.base import Bus
from coordinator.coordination.bus.memory_hub import ZERO, Clock, MemoryBusHub
from coordinator.core.liveness import STREAMS_PRESENCE_TTL_S, STREAMS_REFRESH_S

__all__ = ["MemoryBus", "MemoryBusHub", "MemoryInbox"]

log = logging.getLogger(__name__)

#: awaited before each call that would be a round trip to a store (see ``MemoryBus``)
BeforeIO = Callable[[], Awaitable[None]]

DEFAULT_LISTENER_BUFFER = 10_000


class MemoryInbox(Subscription):
    """One open listen: pub/sub payloads from a bounded buffer, or durable entries in order."""

    def __init__(self, bus: MemoryBus, instance_id: str, buffer: int) -> None:
        self._bus = bus
        self._instance_id = instance_id
        self._send, self._receive = trio.open_memory_channel[bytes](buffer)
        #: the listen was cut (``MemoryBus.drop``); the iterator raises CoordinationUnavailable
        self.lost = False
        self.closed = False
        #: the hub's token for this pub/sub listener while it is registered
        self.listener_token: int | None = None
        #: pub/sub payloads this listener lost because its buffer was full
        self.dropped = 0

    def __aiter__(self) -> MemoryInbox:
        return self

    def offer(self, payload: bytes) -> bool:
        try:
            self._send.send_nowait(payload)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.dropped += 1
            return False
        return True

    def cut(self, *, lost: bool) -> None:
        self.lost = self.lost or lost
        self.closed = True
        self._send.close()
        self._bus.hub.wake(self._instance_id)

    async def __anext__(self) -> bytes:
        if not self._bus.durable:
            try:
                return await self._receive.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                if self.lost:
                    raise self._lost_error() from None
                raise StopAsyncIteration from None
        await trio.lowlevel.checkpoint()
        hub, last_ids = self._bus.hub, self._bus._last_ids
        while True:
            if self.lost:
                raise self._lost_error()
            if self.closed:
                raise StopAsyncIteration
            entry = hub.next_entry(self._instance_id, last_ids[self._instance_id])
            if entry is not None:
                last_ids[self._instance_id] = entry[0]
                return entry[1]
            await hub.appended(self._instance_id).wait()

    def _lost_error(self) -> CoordinationUnavailable:
        where = ""
        if self._bus.durable:
            last = self._bus.last_delivered(self._instance_id)
            where = f"; listening again resumes after entry {last}"
        return CoordinationUnavailable(f"lost the memory inbox of {self._instance_id!r}{where}")


class MemoryBus(Bus):
    """``Bus`` on a ``MemoryBusHub``; see the module docstring. Several objects on one hub model
    several instances sharing a store. One object per instance: a durable one keeps, per
    instance id, the id of the last entry its ``listen`` delivered. One ``listen`` per instance
    id at a time.

    ``before_io``, when given, is awaited before ``send``, ``is_listening``, opening a listen and
    each presence refresh — the calls that are round trips to Redis in production. The
    simulator freezes an instance (and fails its calls during a store outage) through it.
    """

    def __init__(
        self,
        clock: Clock = trio.current_time,
        *,
        hub: MemoryBusHub | None = None,
        durable: bool = False,
        presence_ttl_s: float = STREAMS_PRESENCE_TTL_S,
        refresh_s: float = STREAMS_REFRESH_S,
        maxlen: int = 10_000,
        retention_s: float = 60.0,
        listener_buffer: int = DEFAULT_LISTENER_BUFFER,
        before_io: BeforeIO | None = None,
    ) -> None:
        if not 0 < refresh_s < presence_ttl_s:
            raise ValueError("refresh_s must be positive and shorter than presence_ttl_s")
        if maxlen < 1 or listener_buffer < 1:
            raise ValueError("maxlen and listener_buffer must be positive")
        if not retention_s > presence_ttl_s:
            raise ValueError("retention_s must be longer than presence_ttl_s")
        self.hub = hub if hub is not None else MemoryBusHub(clock)
        self.durable = durable
        self.presence_ttl_s = presence_ttl_s
        self.refresh_s = refresh_s
        self.maxlen = maxlen
        self.retention_s = retention_s
        self._listener_buffer = listener_buffer
        self._before_io = before_io
        self._last_ids: dict[str, int] = {}
        #: the presence token of a durable listen that was lost, per instance id
        self._lost_tokens: dict[str, int] = {}
        #: the refusal count the current (or lost) durable listen started from (StreamsBus)
        self._refusals: dict[str, int] = {}
        self._open: dict[str, MemoryInbox] = {}
        self._killed = False

    def __repr__(self) -> str:
        return f"MemoryBus(durable={self.durable})"

    @property
    def resume_window_s(self) -> float:  # type: ignore[override]
        """As ``StreamsBus``: durable, a lost listen resumes while nothing was refused for it."""
        return self.presence_ttl_s if self.durable else 0.0

    def last_delivered(self, instance_id: str) -> int | None:
        """Id of the last entry ``listen(instance_id)`` delivered (or started after)."""
        return self._last_ids.get(instance_id)

    # -- Bus --------------------------------------------------------------------------------

    async def send(self, instance_id: str, payload: bytes) -> int:
        await self._io()
        if self.durable:
            return self.hub.append(
                instance_id, payload, maxlen=self.maxlen, retention_s=self.retention_s
            )
        return self.hub.publish(instance_id, bytes(payload))

    async def is_listening(self, instance_id: str) -> bool:
        await self._io()
        if self.durable:
            return self.hub.present(instance_id)
        return self.hub.listener_count(instance_id) > 0

    def listen(self, instance_id: str) -> AbstractAsyncContextManager[Subscription]:
        if self.durable:
            return _DurableListen(self, instance_id)
        return self._listen_pubsub(instance_id)

    # -- faults, as a test or the simulator inflicts them --------------------------------------

    def drop(self, instance_id: str) -> bool:
        """Cut the open listen of ``instance_id`` like a lost connection (CLIENT KILL): its
        iterator raises ``CoordinationUnavailable``. Whether a listen was open."""
        inbox = self._open.get(instance_id)
        if inbox is None:
            return False
        if not self.durable:
            # A pub/sub subscriber whose connection dies leaves at once (NUMSUB drops).
            self._leave_pubsub(instance_id, inbox)
        inbox.cut(lost=True)
        return True

    def kill(self) -> None:
        """This process is killed (kill -9): closing its listens from now on runs no cleanup,
        so a durable presence stays until its TTL (as a killed process's key does); pub/sub
        listeners still leave at once, as a closed socket does."""
        self._killed = True

    # -- internals --------------------------------------------------------------------------

    async def _io(self) -> None:
        # The hook first, then the checkpoint that every call makes (as a store client
        # would: reach the store, then wait for its answer).
        if self._before_io is not None:
            await self._before_io()
        await trio.lowlevel.checkpoint()

    def _leave_pubsub(self, instance_id: str, inbox: MemoryInbox) -> None:
        if inbox.listener_token is not None:
            self.hub.remove_listener(instance_id, inbox.listener_token)
            inbox.listener_token = None

    @asynccontextmanager
    async def _listen_pubsub(self, instance_id: str) -> AsyncIterator[MemoryInbox]:
        await self._io()
        inbox = MemoryInbox(self, instance_id, self._listener_buffer)
        inbox.listener_token = self.hub.add_listener(instance_id, inbox.offer)
        self._open[instance_id] = inbox
        try:
            yield inbox
        finally:
            if self._open.get(instance_id) is inbox:
                del self._open[instance_id]
            self._leave_pubsub(instance_id, inbox)
            inbox.cut(lost=False)

    def _start_after(self, instance_id: str) -> tuple[int, bool]:
        """Where a listen starts: after the last delivered entry, or at the inbox's current
        end when this object never listened there (older entries were not meant for us).
        And whether nothing after the last delivered entry can be missing (as StreamsBus)."""
        top = self.hub.last_id(instance_id)
        last = self._last_ids.get(instance_id)
        if last is None:
            return top or ZERO, False
        if top is None or top < last:
            return ZERO, False
        return last, self.hub.kept_everything_after(instance_id, last)

    # -- the durable listen's steps (``_DurableListen`` below) ------------------------------

    async def open_durable(self, instance_id: str) -> tuple[int, MemoryInbox]:
        """Start a durable listen: fix where it starts, then become present."""
        await self._io()
        start, gapless = self._start_after(instance_id)
        self._last_ids[instance_id] = start
        # Present only once the start id is fixed: whatever is appended from now on comes
        # after it. A re-listen after a lost one takes over its token (see StreamsBus).
        lost_token = self._lost_tokens.pop(instance_id, None)
        token = self.hub.new_token() if lost_token is None else lost_token
        refused = self.hub.refresh(instance_id, token, self.presence_ttl_s, self.retention_s)
        unrefused = self._refusals.get(instance_id) == refused
        self._refusals[instance_id] = refused
        inbox = MemoryInbox(self, instance_id, 1)
        inbox.resumed = lost_token is not None and unrefused and gapless
        self._open[instance_id] = inbox
        return token, inbox

    def close_durable(
        self, instance_id: str, token: int, inbox: MemoryInbox, *, lost: bool
    ) -> None:
        """End a durable listen. Closed on purpose, senders learn at once that nobody
        listens; after a lost listen the presence expires by itself, so that what is sent
        until then waits for a re-listen."""
        if self._open.get(instance_id) is inbox:
            del self._open[instance_id]
        inbox.cut(lost=lost)
        if lost:
            self._lost_tokens[instance_id] = token
        elif not self._killed:
            self.hub.withdraw(instance_id, token)

    async def keep_present(self, instance_id: str, token: int) -> None:
        while True:
            await trio.sleep(self.refresh_s)
            try:
                await self._io()
            except CoordinationUnavailable as exc:
                log.debug("could not refresh the presence of inbox %s: %s", instance_id, exc)
                continue
            refused = self.hub.refresh(instance_id, token, self.presence_ttl_s, self.retention_s)
            inbox = self._open.get(instance_id)
            if refused != self._refusals.get(instance_id) and inbox is not None:
                # Its presence lapsed and an envelope for it was refused: lost (StreamsBus).
                inbox.cut(lost=True)
                return


class _DurableListen(AbstractAsyncContextManager[Subscription]):
    """``MemoryBus.listen`` in durable mode. A class rather than a generator: the presence
    refresher runs in a nursery that must close without the block's own exception, or that
    exception would reach the caller wrapped in an ExceptionGroup."""

    def __init__(self, bus: MemoryBus, instance_id: str) -> None:
        self._bus, self._instance_id = bus, instance_id
        self._stack = AsyncExitStack()
        self._token = 0
        self._inbox: MemoryInbox | None = None
        self._refresher: trio.Nursery | None = None

    async def __aenter__(self) -> MemoryInbox:
        bus, instance_id = self._bus, self._instance_id
        self._token, inbox = await bus.open_durable(instance_id)
        self._inbox = inbox
        self._refresher = nursery = await self._stack.enter_async_context(trio.open_nursery())
        nursery.start_soon(bus.keep_present, instance_id, self._token)
        return inbox

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        bus, instance_id, inbox = self._bus, self._instance_id, self._inbox
        assert inbox is not None
        lost = inbox.lost or isinstance(exc, CoordinationUnavailable)
        assert self._refresher is not None
        self._refresher.cancel_scope.cancel()
        await self._stack.aclose()
        bus.close_durable(instance_id, self._token, inbox, lost=lost)
