"""The embedded-store lock on PostgreSQL (``store/embedded_lock.py``), in process against the
real server: a second taker is refused while the first holds it; a session lost while the
holder runs (terminated by the server) is noticed by the check and the lock taken again, so a
second instance is still refused; once another session took it, the check says so. (The
refusals of whole ``gemmanet serve`` processes, SQLite and PostgreSQL, and ``kill -9``:
tests/e2e/test_deployment_checks.py.)"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from coordinator.errors import StartupRefused
from coordinator.store import Store
from coordinator.store.embedded_lock import EMBEDDED_LOCK_ID, lock_embedded_store

pytestmark = pytest.mark.postgres


def _lock_pids(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND classid = :k AND objid::int = hashtext(current_schema())"
            ),
            {"k": EMBEDDED_LOCK_ID},
        )
        return [int(row[0]) for row in rows]


def test_a_lost_session_is_replaced_and_the_lock_taken_again(postgresql_database_url: str) -> None:
    with Store.open(postgresql_database_url) as first, Store.open(postgresql_database_url) as other:
        lock = lock_embedded_store(first.engine)
        assert lock is not None and lock.check is not None
        with pytest.raises(StartupRefused, match="another instance .* already runs"):
            lock_embedded_store(other.engine)
        assert lock.check() is None  # held, nothing to say
        [pid] = _lock_pids(other.engine)
        # With a timeout, pg_terminate_backend waits until the backend has exited (and so
        # released its advisory lock); without one it only signals it, and a lock asked for
        # at once could still find the old session holding it.
        with other.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p, 5000)"), {"p": pid})
            conn.commit()
        message = lock.check()
        assert message is not None and "taken again on a new one" in message, message
        [new_pid] = _lock_pids(other.engine)
        assert new_pid != pid
        with pytest.raises(StartupRefused):
            lock_embedded_store(other.engine)
        # Lost again, and another session is quicker: the check says so.
        with other.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:p, 5000)"), {"p": new_pid})
            conn.commit()
        intruder = lock_embedded_store(other.engine)
        assert intruder is not None
        message = lock.check()
        assert message is not None and "another session" in message, message
        intruder.release()
        lock.release()
