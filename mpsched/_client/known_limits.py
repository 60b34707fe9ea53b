"""The limits a client last heard its manager know, to check a job's ``limit=`` at once."""

from __future__ import annotations

from mpsched._client.link import ManagerLink
from mpsched._core.job import check_name
from mpsched._core.limits import LimitSpec, parse_limit, parse_rate, unknown_limit
from mpsched._errors import InvalidJobError


class KnownLimits:
    """The manager's limits as last heard: a job naming one is sent write-behind; any
    other name is checked with the manager first."""

    def __init__(self, link: ManagerLink) -> None:
        self._link = link
        self._known: frozenset[str] = frozenset()

    def fetch(self) -> dict[str, str]:
        """The manager's limits by name, each in its form; remembered."""
        known = self._link.ask(lambda service: service.limits())
        self._known = frozenset(known)
        return known

    def declare(self, name: str, concurrency: int | None, rate: str | None) -> None:
        """Declare or change the limit ``name`` on the manager; raises as Client.set_limit."""
        form = str(LimitSpec(concurrency=_concurrency(concurrency), rate=parse_rate(rate)))
        parse_limit(name, form or LimitSpec())
        self._link.ask(lambda service: service.set_limit(name, form))
        self._known = self._known | {name}

    def check(self, limit: str | None) -> None:
        """Raises InvalidJobError unless the manager knows ``limit`` (None passes)."""
        if limit is None or limit in self._known:
            return
        check_name("limit", limit)
        known = self.fetch()
        if limit not in known:
            raise unknown_limit(limit, known)


def _concurrency(concurrency: object) -> int | None:
    if concurrency is None:
        return None
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidJobError(f"concurrency must be an int >= 1 or None, not {concurrency!r}")
    return concurrency
