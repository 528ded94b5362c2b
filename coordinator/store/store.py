"""``Store``: API keys, node tokens, finished tasks and their ratings, in one SQL database.

The work is synchronous SQLAlchemy Core; each ``async`` method runs its ``*_sync`` twin in a
worker thread (``trio.to_thread.run_sync``) behind a capacity limiter, so the trio loop never
blocks on the database and the pool is never asked for more connections than it holds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Self, TypeVar

import sqlalchemy as sa
import trio
from sqlalchemy.engine import URL, Connection, Engine

from protocol.constraints import MAX_IDENTIFIER_LENGTH, is_identifier

from .engine import create_engine, create_tables, is_sqlite_memory, normalize_url, safe_url
from .errors import AlreadyRated, StoreError, TaskForbidden, TaskNotFound
from .keys import tokens
from .keys.auth import AUTH_CACHE_SIZE, AUTH_CACHE_TTL_S, CachedAuth
from .keys.lifecycle import Lifecycle, log_change
from .records import TASK_STATUSES, ApiKey, TaskRecord, UsageRow, check_priority, task_row
from .schema import api_keys, node_tokens, ratings, tasks
from .translate import translate_errors as _translate_errors
from .usage import check_usage_window, usage_query, usage_rows

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_THREADS = 8
MAX_NAME_LENGTH = 255


class Store:
    """The durable store. Open with ``Store.open(url)``; one per process is plenty."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_threads: int = DEFAULT_MAX_THREADS,
        auth_cache_ttl_s: float = AUTH_CACHE_TTL_S,
        auth_cache_size: int = AUTH_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = engine
        self._max_threads = max_threads
        self._limiter: trio.CapacityLimiter | None = None
        self._wall_clock = wall_clock
        #: listing, revoking, rotating keys and nodes; the batched last-used writes
        self.lifecycle = Lifecycle(engine, wall_clock)
        #: the authentication cache and the revocation epoch that keeps it honest
        self.auth = CachedAuth(
            lambda key_hash: self._run(_translate_errors(self._lookup_api_key), key_hash),
            lambda: self._run(_translate_errors(self.lifecycle.read_epoch)),
            ttl_s=auth_cache_ttl_s,
            max_size=auth_cache_size,
            clock=clock,
            wall_clock=wall_clock,
        )

    @classmethod
    def open(
        cls,
        url: str | URL,
        *,
        max_threads: int = DEFAULT_MAX_THREADS,
        auth_cache_ttl_s: float = AUTH_CACHE_TTL_S,
        auth_cache_size: int = AUTH_CACHE_SIZE,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> Store:
        """Connect to ``url`` and create any missing tables. Synchronous; call before serving."""
        parsed = normalize_url(url)
        if is_sqlite_memory(parsed):
            max_threads = 1  # one shared connection: serialise its users
        engine = create_engine(parsed, pool_size=max_threads)
        try:
            create_tables(engine)
        except BaseException:
            engine.dispose()
            raise
        log.debug("store opened at %s", safe_url(parsed))
        return cls(
            engine,
            max_threads=max_threads,
            auth_cache_ttl_s=auth_cache_ttl_s,
            auth_cache_size=auth_cache_size,
            clock=clock,
            wall_clock=wall_clock,
        )

    def close(self) -> None:
        self.auth.clear()
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Store {self.safe_url}>"

    @property
    def safe_url(self) -> str:
        """The database URL without its password (for log lines)."""
        return safe_url(self._engine.url)

    @property
    def engine(self) -> Engine:
        return self._engine

    # ------------------------------------------------------------------ plumbing

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a synchronous operation of the store (``lifecycle``'s) in a worker thread."""
        return await self._run(fn, *args)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._limiter is None:
            # Made lazily so a Store opened outside trio (CLI, fixtures) binds to no run.
            self._limiter = trio.CapacityLimiter(self._max_threads)
        # Not abandoned on cancel: a write in flight finishes (or fails) before we return.
        return await trio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        with self._engine.begin() as conn:
            yield conn

    # ------------------------------------------------------------------ API keys

    @_translate_errors
    def create_api_key_sync(
        self,
        name: str,
        *,
        admin: bool = False,
        priority: int = 1,
        expires_at: float | None = None,
        actor: str | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a client API key (an operator key with ``admin``; ``priority``: its weight in
        the fair admission queue; refused from ``expires_at``, unix seconds, when given).
        Returns the record and the plaintext key, shown only once. ``actor`` (who asked) goes
        to the change log."""
        check_key_name(name)
        check_priority(priority)
        plaintext = tokens.new_api_key()
        record = ApiKey(
            key_id=tokens.new_key_id(),
            name=name,
            admin=admin,
            expires_at=expires_at,
            priority=priority,
        )
        now = self._wall_clock()
        with self._transaction() as conn:
            conn.execute(
                api_keys.insert().values(
                    key_id=record.key_id,
                    name=record.name,
                    key_hash=tokens.digest(plaintext),
                    created_at=now,
                    is_admin=admin,
                    expires_at=expires_at,
                    priority=priority,
                )
            )
            log_change(conn, now, actor, "key.create", record.key_id)
        log.info("created %sAPI key %s (%s)", "admin " if admin else "", record.key_id, name)
        return record, plaintext

    @_translate_errors
    def authenticate_api_key_sync(self, plaintext: str) -> ApiKey | None:
        if not tokens.looks_like(plaintext, tokens.API_KEY_PREFIX):
            return None
        return self._lookup_api_key(tokens.digest(plaintext))

    def _lookup_api_key(self, key_hash: str) -> ApiKey | None:
        with self._engine.connect() as conn:
            row = conn.execute(
                sa.select(
                    api_keys.c.key_id,
                    api_keys.c.name,
                    api_keys.c.key_hash,
                    api_keys.c.is_admin,
                    api_keys.c.priority,
                )
                .add_columns(api_keys.c.expires_at)
                .where(api_keys.c.key_hash == key_hash, api_keys.c.revoked_at.is_(None))
                .where(_unexpired(self._wall_clock()))
            ).first()
        if row is None or not tokens.digests_equal(row.key_hash, key_hash):
            return None
        return ApiKey(
            key_id=row.key_id,
            name=row.name,
            admin=bool(row.is_admin),
            expires_at=row.expires_at,
            priority=int(row.priority),
        )

    async def authenticate_api_key(self, plaintext: str) -> ApiKey | None:
        """The key's record, or None when it is unknown, malformed, revoked or expired.

        Positive answers are cached for ~30 s (bounded), since this runs on every request; a
        revocation anywhere empties the cache within a second (``auth.CachedAuth``).
        """
        if not tokens.looks_like(plaintext, tokens.API_KEY_PREFIX):
            return None
        return await self.auth.authenticate(tokens.digest(plaintext))

    # ------------------------------------------------------------------ node tokens

    @_translate_errors
    def enroll_node_sync(self, node_id: str, *, actor: str | None = None) -> str:
        """Issue a token for ``node_id``; any earlier token of that node stops working (and a
        revocation of it is lifted). ``actor`` (who asked) goes to the change log."""
        check_node_id(node_id)
        plaintext = tokens.new_node_token()
        now = self._wall_clock()
        values = {"token_hash": tokens.digest(plaintext), "enrolled_at": now, "revoked_at": None}
        for attempt in range(2):
            try:
                with self._transaction() as conn:
                    updated = conn.execute(
                        node_tokens.update()
                        .where(node_tokens.c.node_id == node_id)
                        .values(**values)
                    ).rowcount
                    if not updated:
                        conn.execute(node_tokens.insert().values(node_id=node_id, **values))
                    log_change(conn, now, actor, "node.enroll", node_id)
                break
            except sa.exc.IntegrityError:
                # Another process enrolled the same node between our update and insert; the
                # retry's update now finds its row and replaces that token with ours.
                if attempt:
                    raise
        log.info("enrolled node %s", node_id)
        return plaintext

    @_translate_errors
    def verify_node_token_sync(self, node_id: str, token: str) -> bool:
        if not isinstance(node_id, str) or not tokens.looks_like(token, tokens.NODE_TOKEN_PREFIX):
            return False
        with self._engine.connect() as conn:
            stored = conn.execute(
                sa.select(node_tokens.c.token_hash).where(
                    node_tokens.c.node_id == node_id, node_tokens.c.revoked_at.is_(None)
                )
            ).scalar_one_or_none()
        if stored is None:
            return False
        return tokens.digests_equal(stored, tokens.digest(token))

    async def verify_node_token(self, node_id: str, token: str) -> bool:
        """True only for the node's current token, unless revoked (not cached: re-enrolling
        and revoking take effect now)."""
        return await self._run(self.verify_node_token_sync, node_id, token)

    # ------------------------------------------------------------------ tasks

    @_translate_errors
    def record_task_sync(self, record: TaskRecord) -> None:
        if record.status not in TASK_STATUSES:
            raise ValueError(f"task status must be one of {sorted(TASK_STATUSES)}")
        try:
            with self._transaction() as conn:
                conn.execute(tasks.insert().values(**task_row(record)))
        except sa.exc.IntegrityError as exc:
            raise StoreError(f"task {record.task_id} was already recorded") from exc

    async def record_task(self, record: TaskRecord) -> None:
        """Persist a finished task. Recording the same task_id twice raises StoreError."""
        await self._run(self.record_task_sync, record)

    @_translate_errors
    def record_tasks_sync(self, records: Sequence[TaskRecord]) -> int:
        """Persist many finished tasks in one transaction (the server batches its writes).
        A task id already recorded is skipped, not an error. Returns how many were written."""
        for record in records:
            if record.status not in TASK_STATUSES:
                raise ValueError(f"task status must be one of {sorted(TASK_STATUSES)}")
        rows = [task_row(r) for r in records]
        if not rows:
            return 0
        try:
            with self._transaction() as conn:
                conn.execute(tasks.insert(), rows)
            return len(rows)
        except sa.exc.IntegrityError:
            written = 0
            for record in records:  # a replayed id in the batch: write the others one by one
                try:
                    self.record_task_sync(record)
                    written += 1
                except StoreError:
                    pass
            return written

    async def record_tasks(self, records: Sequence[TaskRecord]) -> int:
        return await self._run(self.record_tasks_sync, records)

    @_translate_errors
    def get_task_sync(self, task_id: str) -> TaskRecord | None:
        with self._engine.connect() as conn:
            row = conn.execute(sa.select(tasks).where(tasks.c.task_id == task_id)).first()
        if row is None:
            return None
        return TaskRecord(
            task_id=row.task_id,
            key_id=row.key_id,
            node_id=row.node_id,
            model=row.model,
            status=row.status,
            error_code=row.error_code,
            created_at=row.created_at,
            finished_at=row.finished_at,
            stream=bool(row.stream),
            instance_id=row.instance_id,
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens,
        )

    async def get_task(self, task_id: str) -> TaskRecord | None:
        return await self._run(self.get_task_sync, task_id)

    @_translate_errors
    def usage_sync(self, since: float, until: float, key_id: str | None = None) -> list[UsageRow]:
        check_usage_window(since, until)
        with self._engine.connect() as conn:
            return usage_rows(conn.execute(usage_query(since, until, key_id)))

    async def usage(self, since: float, until: float, key_id: str | None = None) -> list[UsageRow]:
        """Tokens and tasks per (key, model), ordered so, of the tasks created in [since,
        until) (Unix seconds); ``key_id`` None: every key. ValueError for a bad window.

        Only tasks already written count: records are written in batches (TaskRecorder),
        so a task that just ended may be missing for that batch's interval."""
        return await self._run(self.usage_sync, since, until, key_id)

    # ------------------------------------------------------------------ ratings

    @_translate_errors
    def rate_task_sync(self, task_id: str, key_id: str, score: int) -> None:
        if isinstance(score, bool) or not isinstance(score, int) or not 1 <= score <= 5:
            raise ValueError("score must be an integer from 1 to 5")
        # One INSERT ... SELECT: the row is written only if the task exists and belongs to this
        # key, and the ratings primary key lets exactly one of any number of concurrent raters
        # (in any process) win. No read-then-write window, so no lock upgrade on SQLite either.
        owned_task = sa.select(
            tasks.c.task_id,
            tasks.c.key_id,
            sa.literal(score, sa.Integer),
            sa.literal(self._wall_clock(), sa.Float),
        ).where(tasks.c.task_id == task_id, tasks.c.key_id == key_id)
        try:
            with self._transaction() as conn:
                inserted = conn.execute(
                    ratings.insert().from_select(
                        ["task_id", "key_id", "score", "rated_at"], owned_task
                    ),
                    # SQLAlchemy only keeps an INSERT's rowcount when asked to.
                    execution_options={"preserve_rowcount": True},
                ).rowcount
        except sa.exc.IntegrityError as exc:
            raise AlreadyRated(f"task {task_id} is already rated") from exc
        if inserted:
            return
        with self._engine.connect() as conn:
            owner = conn.execute(
                sa.select(tasks.c.key_id).where(tasks.c.task_id == task_id)
            ).scalar_one_or_none()
        if owner is None:
            raise TaskNotFound(f"no task with id {task_id}")
        if owner == key_id:
            # The task's record was written (by a batch, maybe on another instance) between the
            # INSERT and this read: it is this key's task after all, not another key's.
            raise TaskNotFound(f"task {task_id} was being recorded; ask again")
        raise TaskForbidden(f"task {task_id} was requested with another API key")

    async def rate_task(self, task_id: str, key_id: str, score: int) -> None:
        """Rate a task once, 1..5, with the key that requested it.

        Raises TaskNotFound, TaskForbidden or AlreadyRated (ValueError for a bad score).
        """
        await self._run(self.rate_task_sync, task_id, key_id, score)

    @_translate_errors
    def node_ratings_sync(self) -> dict[str, tuple[float, int]]:
        query = (
            sa.select(
                tasks.c.node_id,
                sa.func.avg(ratings.c.score),
                sa.func.count(),
            )
            .select_from(ratings.join(tasks, ratings.c.task_id == tasks.c.task_id))
            .where(tasks.c.node_id.is_not(None))
            .group_by(tasks.c.node_id)
        )
        with self._engine.connect() as conn:
            rows = conn.execute(query).all()
        return {node_id: (float(mean), int(count)) for node_id, mean, count in rows}

    async def node_ratings(self) -> dict[str, tuple[float, int]]:
        """node_id -> (mean score, number of ratings), over every rated task of that node."""
        return await self._run(self.node_ratings_sync)


def _unexpired(now: float) -> sa.ColumnElement[bool]:
    return sa.or_(api_keys.c.expires_at.is_(None), api_keys.c.expires_at > now)


def check_key_name(name: str) -> None:
    """Raise ValueError (a sentence naming the rule) unless ``name`` may label an API key."""
    _check_text("name", name)


def check_node_id(node_id: str) -> None:
    """Raise ValueError unless ``node_id`` is an identifier the node protocol carries: a token
    for any other id could never connect (its hello would be refused)."""
    if not isinstance(node_id, str) or not is_identifier(node_id):
        raise ValueError(
            f"node id must be 1-{MAX_IDENTIFIER_LENGTH} characters of A-Z a-z 0-9 . _ : -"
            f" (the node protocol's rule); got {_preview(node_id)}"
        )


def _preview(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_text(what: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be a non-empty string of at most {MAX_NAME_LENGTH} chars")
