"""The options of ``submit``: the callable, what it asks of its job, and ``--every`` or
``--cron`` for a schedule of runs."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from mpsched._cli import values
from mpsched._cli.options import CONNECT_HELP, KEY_HELP, tls_options
from mpsched._core.job import Priority
from mpsched._core.options import Catchup, Mode, OnError, Overlap
from mpsched._core.recurring import MIN_INTERVAL


def submit_options(submit: argparse.ArgumentParser) -> None:
    """The options of ``submit``, in the order its --help lists them."""
    submit.add_argument(
        "target",
        help="module:function, importable here and on the workers (or sent with --by-value)",
    )
    submit.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    submit.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    _job_options(submit)
    tls_options(submit, serving=False)
    submit.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job and print its result: as JSON, or, when JSON "
        "cannot hold it (a set, an object), its repr, said on stderr; "
        "a failure prints the worker's traceback on stderr. Ctrl-C "
        "stops waiting and leaves the job as it is, queued or running",
    )
    _recurring_options(submit)


def _job_options(submit: argparse.ArgumentParser) -> None:
    """What ``submit`` asks of one job: its arguments, time, priority and limits."""
    _call_options(submit)
    _retry_options(submit)
    _placement_options(submit)


def _call_options(submit: argparse.ArgumentParser) -> None:
    """The job's arguments, when it is due, its priority and how long it may run."""
    submit.add_argument(
        "--args", default="[]", metavar="JSON", help="JSON list of positional arguments"
    )
    submit.add_argument(
        "--kwargs", default="{}", metavar="JSON", help="JSON object of keyword arguments"
    )
    when = submit.add_mutually_exclusive_group()
    when.add_argument(
        "--delay",
        type=float,
        metavar="SECONDS",
        help="due this many seconds after the manager receives the job (default: due now)",
    )
    when.add_argument(
        "--at",
        metavar="TIME",
        help="due at this ISO 8601 time, as 2026-12-03T02:00 (naive means local time)",
    )
    submit.add_argument(
        "--priority",
        choices=[p.name.lower() for p in Priority],
        default=Priority.MEDIUM.name.lower(),
        help="among jobs due at the same time, high runs before medium "
        "before low (default: %(default)s)",
    )
    submit.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help="seconds the job may run once a worker takes it; then its "
        "process tree is killed and the job fails (default: none)",
    )


def _retry_options(submit: argparse.ArgumentParser) -> None:
    """Whether the job runs again after its worker dies, or after it raises."""
    submit.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="times to run the job again if its worker dies under it (default: %(default)s)",
    )
    submit.add_argument(
        "--retry",
        type=int,
        metavar="N",
        help="a retry policy: run the job again up to N times when it "
        "raises or its worker dies, with back-off (not with --retries)",
    )
    submit.add_argument(
        "--backoff",
        type=float,
        metavar="SECONDS",
        help="with --retry: seconds before the first retry, doubling for "
        "each next one, up to 600 (default: 1)",
    )


def _placement_options(submit: argparse.ArgumentParser) -> None:
    """Where the job waits and on what: its queue, limit and parents; the code sent with
    it, and its idempotency key."""
    submit.add_argument(
        "--queue",
        type=values.queue_name,
        default="default",
        metavar="NAME",
        help="the queue it waits in: only workers serving it run it (default: %(default)s)",
    )
    submit.add_argument(
        "--limit",
        type=values.limit_name,
        metavar="NAME",
        help="a limit the manager declares (serve --limit): the job starts "
        "only while that limit has room",
    )
    submit.add_argument(
        "--by-value",
        action="append",
        default=[],
        metavar="MODULE",
        help="send MODULE's code with the job (pickled by value), for a "
        "module the workers cannot import; importable here, it may be "
        "a package (its submodules go too); repeatable",
    )
    submit.add_argument(
        "--after",
        action="append",
        metavar="JOB_ID",
        help="run the job once the job JOB_ID has ended (it fails if that "
        "one fails or is cancelled); repeatable",
    )
    submit.add_argument(
        "--key",
        metavar="KEY",
        help="an idempotency key: while a job with this key is pending or "
        "running (or its outcome kept by a store), submit prints that "
        "job's id and queues nothing",
    )


def _recurring_options(submit: argparse.ArgumentParser) -> None:
    """``submit --every`` and ``--cron``: a schedule, and how its runs go."""
    recurring = submit.add_argument_group(
        "recurring",
        textwrap.fill(
            "With --every or --cron the callable runs on a schedule kept by the manager (and "
            "by its store, across restarts); submit prints the schedule's id. With --every, "
            "--delay or --at sets the first run (default: one interval from now).",
            77,
        ),
    )
    how = recurring.add_mutually_exclusive_group()
    how.add_argument(
        "--every",
        type=values.interval,
        metavar="SECONDS",
        help=f"run every SECONDS (at least {MIN_INTERVAL:g}): with --mode rate "
        f"at start + k * SECONDS (no drift), with --mode delay SECONDS "
        f"after the previous run ended",
    )
    how.add_argument(
        "--cron",
        metavar="EXPR",
        help="run at the times of a five-field cron expression, as "
        "'30 2 * * 1-5' (needs pip install 'mpsched[cron]')",
    )
    recurring.add_argument(
        "--tz",
        metavar="ZONE",
        help="the zone --cron is read in, as Europe/Berlin (default: the manager's local zone)",
    )
    recurring.add_argument(
        "--id",
        dest="schedule_id",
        metavar="NAME",
        help="the schedule's name; submitting it again with the same "
        "spec changes nothing, with another replaces it (default: "
        "derived from the callable and the spec)",
    )
    _run_policy_options(recurring)


def _run_policy_options(recurring: argparse._ArgumentGroup) -> None:
    """How a schedule's runs go: planned at a rate or after each other, overlapping,
    caught up, jittered, and what a failed one does to the schedule."""
    recurring.add_argument(
        "--mode",
        choices=values.words(Mode),
        default=Mode.RATE,
        help="with --every: rate plans runs at start + k * SECONDS; delay "
        "plans each run SECONDS after the previous one ended "
        "(default: %(default)s)",
    )
    recurring.add_argument(
        "--overlap",
        choices=values.words(Overlap),
        default=Overlap.SKIP,
        help="a run due while the previous one is pending or running: "
        "skip it, queue it until that one ends, or allow both "
        "(default: %(default)s)",
    )
    recurring.add_argument(
        "--catchup",
        choices=values.words(Catchup),
        default=Catchup.LATEST,
        help="runs missed while the manager was down or busy: run the "
        "latest one, all of them, or none (default: %(default)s)",
    )
    recurring.add_argument(
        "--jitter",
        type=values.seconds_or_zero,
        default=0.0,
        metavar="SECONDS",
        help="start each run up to SECONDS after its time, the same "
        "offset for a given time across restarts (default: 0)",
    )
    recurring.add_argument(
        "--on-error",
        choices=values.words(OnError),
        default=OnError.CONTINUE,
        help="a run that fails: continue the schedule, or pause it (default: %(default)s)",
    )
