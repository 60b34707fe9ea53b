"""The status server's routes: a request's method, path and query to an answer.

No sockets here (mpsched._manager.http.server reads requests and writes answers): a route
gets the method, the target and whether the request may act, and returns a
:class:`Response`, or raises :class:`HttpError`, whose message becomes the answer's one
line. Paths:

- ``GET /``: the page; ``GET /metrics``: Prometheus text;
- ``GET /api/status`` (what ``status --json`` prints), ``GET /api/dashboard`` (what the
  page shows), ``GET /api/jobs?state=...&limit=...``, ``GET /api/jobs/ID``;
- with a token: ``POST /api/jobs/ID/cancel``, ``POST /api/schedules/ID/pause`` and
  ``.../resume``.

Ids are percent-encoded path segments (a run's id holds ``@`` and ``:``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.parse
from importlib import resources
from typing import Any, NamedTuple

from mpsched._core.job import JobState
from mpsched._errors import ScheduleNotFoundError
from mpsched._manager.http.metrics import CONTENT_TYPE as METRICS_TYPE
from mpsched._manager.http.views import DEFAULT_LIMIT, MAX_LIMIT, Views
from mpsched._manager.service import ManagerService

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
HTML = "text/html; charset=utf-8"
DASHBOARD_CLIENT = "dashboard"  # the client id a cancel from the page is made by


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    """A request that gets a 4xx: ``message`` is the answer's one line."""

    def __init__(
        self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class Page(NamedTuple):
    """The page, and the Content-Security-Policy that lets its inline code alone run."""

    html: bytes
    policy: str


def load_page() -> Page:
    """``page.html`` from the package, with hashes of its inline script and style."""
    html = resources.files(__package__).joinpath("page.html").read_text(encoding="utf-8")

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", html, re.DOTALL)
        return " ".join(
            f"'sha256-{base64.b64encode(hashlib.sha256(b.encode()).digest()).decode()}'"
            for b in bodies
        )

    policy = (
        f"default-src 'none'; script-src {hashes('script')}; "
        f"style-src {hashes('style')}; connect-src 'self'; img-src data:; "
        f"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return Page(html=html.encode(), policy=policy)


class Routes:
    """The answers of one manager's status server."""

    def __init__(self, views: Views, service: ManagerService, page: Page) -> None:
        self._views = views
        self._service = service
        self._page = page

    def answer(self, method: str, target: str, *, may_act: bool) -> Response:
        """The answer to ``method`` on ``target`` (path and query).

        Raises:
            HttpError: an unknown path (404), a method it does not take (405), a bad query
                (400), an action without a token (403), an unknown job or schedule (404),
                a job that is no longer pending (409).
        """
        split = urllib.parse.urlsplit(target)
        parts = [urllib.parse.unquote(p) for p in split.path.split("/")[1:]]
        if method == "POST":
            return self._act(parts, may_act)
        if split.path == "/":
            return Response(
                status=200,
                content_type=HTML,
                body=self._page.html,
                headers=(("Content-Security-Policy", self._page.policy),),
            )
        if split.path == "/metrics":
            return Response(
                status=200, content_type=METRICS_TYPE, body=self._views.metrics().encode()
            )
        if split.path == "/api/status":
            return _json(self._views.status(), indent=2)
        if split.path == "/api/dashboard":
            return _json(self._views.dashboard(actions=may_act))
        if split.path == "/api/jobs":
            return _json(self._views.jobs(*_listing(split.query)))
        if len(parts) == 3 and parts[:2] == ["api", "jobs"]:
            shown = self._views.job(parts[2])
            if shown is None:
                raise HttpError(404, f"no job {parts[2]!r}: never submitted, or forgotten")
            return _json(shown)
        if _known_action(parts):
            raise HttpError(405, f"{split.path} takes POST", (("Allow", "POST"),))
        raise HttpError(
            404,
            f"nothing at {split.path}: see / for the page, /metrics, "
            f"/api/status, /api/dashboard, /api/jobs",
        )

    def _act(self, parts: list[str], may_act: bool) -> Response:
        if not _known_action(parts):
            raise HttpError(
                405, f"/{'/'.join(parts)} takes GET (or HEAD) only", (("Allow", "GET, HEAD"),)
            )
        if not may_act:
            raise HttpError(
                403,
                "read-only: this server has no token (serve --http with "
                "--http-token-file lets token holders act)",
            )
        kind, target, action = parts[1], parts[2], parts[3]
        if kind == "jobs":
            if not self._service.cancel(target, DASHBOARD_CLIENT):
                raise HttpError(
                    409,
                    f"job {target!r} is not pending (running, ended, or "
                    f"unknown): only a pending job can be cancelled",
                )
            return _json({"job_id": target, "cancelled": True})
        try:
            info = self._service.schedule_control(target, action)
        except ScheduleNotFoundError:
            raise HttpError(404, f"no schedule {target!r}") from None
        return _json({"schedule_id": target, "paused": info.paused})


def _known_action(parts: list[str]) -> bool:
    return (
        len(parts) == 4
        and parts[0] == "api"
        and (
            (parts[1] == "jobs" and parts[3] == "cancel")
            or (parts[1] == "schedules" and parts[3] in ("pause", "resume"))
        )
    )


def _listing(query: str) -> tuple[JobState | None, int]:
    """``state`` and ``limit`` of ``/api/jobs``."""
    try:
        fields = urllib.parse.parse_qs(
            query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=4
        )
    except ValueError:
        raise HttpError(400, "the query does not parse: use ?state=STATE&limit=N") from None
    unknown = set(fields) - {"state", "limit"}
    if unknown or any(len(v) > 1 for v in fields.values()):
        raise HttpError(400, "use ?state=STATE&limit=N, each at most once")
    state = fields.get("state", [""])[0]
    limit = fields.get("limit", [str(DEFAULT_LIMIT)])[0]
    states = [s.value for s in JobState]
    if state and state not in states:
        raise HttpError(400, f"state must be one of {', '.join(states)}")
    if not (
        limit.isascii() and limit.isdigit() and len(limit) <= 4 and 1 <= int(limit) <= MAX_LIMIT
    ):
        raise HttpError(400, f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return (JobState(state) if state else None), int(limit)


def _json(value: Any, indent: int | None = None) -> Response:
    return Response(
        status=200, content_type=JSON, body=(json.dumps(value, indent=indent) + "\n").encode()
    )
