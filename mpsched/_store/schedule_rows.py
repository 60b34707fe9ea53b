"""The schedules and limits a SQLite store keeps, each in a table of its own."""

from __future__ import annotations

from collections.abc import Callable

from mpsched._store.base import StoredSchedule
from mpsched._store.readers import Readers
from mpsched._store.writer import Writer


class ScheduleRows:
    """Rows of the schedules and limits tables; ``flush`` makes posted changes readable."""

    def __init__(self, writer: Writer, readers: Readers, flush: Callable[[], None]) -> None:
        self._writer = writer
        self._readers = readers
        self._flush = flush

    def save_schedule(self, schedule: StoredSchedule) -> None:
        """Record a schedule, replacing one with its id; wait for the commit."""
        self._writer.call(
            lambda conn: conn.execute(
                "INSERT INTO schedules (schedule_id, spec, state) VALUES (?, ?, ?) "
                "ON CONFLICT (schedule_id) DO UPDATE SET spec = excluded.spec, "
                "state = excluded.state",
                schedule,
            )
        )

    def update_schedule(self, schedule_id: str, state: bytes) -> None:
        """Record where a schedule stands, in the writer's next batch."""
        self._writer.post(
            lambda conn: conn.execute(
                "UPDATE schedules SET state = ? WHERE schedule_id = ?", (state, schedule_id)
            )
        )

    def delete_schedule(self, schedule_id: str) -> None:
        """Forget a schedule; wait for the commit."""
        self._writer.call(
            lambda conn: conn.execute("DELETE FROM schedules WHERE schedule_id = ?", (schedule_id,))
        )

    def schedules(self) -> list[StoredSchedule]:
        """Every schedule, in the order they were first added."""
        self._flush()  # states posted so far are readable
        with self._readers.connection() as conn:
            rows = conn.execute(
                "SELECT schedule_id, spec, state FROM schedules ORDER BY rowid"
            ).fetchall()
        return [StoredSchedule._make(row) for row in rows]

    def save_limit(self, name: str, form: str | None) -> None:
        """Record a limit's form, or (None) forget it; wait for the commit."""
        if form is None:
            self._writer.call(
                lambda conn: conn.execute("DELETE FROM limits WHERE name = ?", (name,))
            )
        else:
            self._writer.call(
                lambda conn: conn.execute(
                    "INSERT INTO limits (name, form) VALUES (?, ?) "
                    "ON CONFLICT (name) DO UPDATE SET form = excluded.form",
                    (name, form),
                )
            )

    def saved_limits(self) -> dict[str, str]:
        """Each limit's form by name."""
        with self._readers.connection() as conn:
            rows = conn.execute("SELECT name, form FROM limits ORDER BY name").fetchall()
        return dict(rows)
