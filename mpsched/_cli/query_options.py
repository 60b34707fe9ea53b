"""The options of the commands that ask a manager about its jobs or act on one by its id:
``status``, ``jobs``, ``schedules``, ``cancel``, ``requeue`` and ``result``."""

from __future__ import annotations

import argparse

from mpsched._cli import values
from mpsched._core.job import JobState


def status_options(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "--json",
        action="store_true",
        help="print the status as JSON (times in seconds, memory and the store's size in bytes)",
    )


def schedules_options(schedules: argparse.ArgumentParser) -> None:
    schedules.add_argument(
        "--json",
        action="store_true",
        help="print the schedules as JSON (times as UTC ISO 8601; "
        "next_run_id: the job id of the run queued for next_run, "
        "last_run: of the latest run that started)",
    )


def cancel_options(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument(
        "job_id", metavar="ID", help="a job's id, as submit printed it, or a schedule's id"
    )


def jobs_options(jobs: argparse.ArgumentParser) -> None:
    jobs.add_argument(
        "--state",
        choices=[state.value for state in JobState],
        help="only jobs in this state (default: all; finished jobs are "
        "listed for --result-ttl seconds, in memory within bounds "
        "without --store)",
    )
    jobs.add_argument(
        "--limit",
        type=values.count,
        metavar="N",
        help="at most N jobs, the first in submission order (default: all)",
    )
    jobs.add_argument(
        "--json",
        action="store_true",
        help="print a JSON list; due as an ISO 8601 UTC time and due_in in "
        "seconds from now (negative: overdue)",
    )


def result_options(result: argparse.ArgumentParser) -> None:
    result.add_argument("job_id", metavar="JOB_ID", help="the job's id, as submit printed it")
    result.add_argument(
        "--wait",
        action="store_true",
        help="wait until the job has finished (default: exit 124 at once if "
        "it is still pending or running); Ctrl-C stops waiting and "
        "leaves the job as it is, queued or running",
    )
    result.add_argument(
        "--timeout",
        type=values.seconds,
        metavar="SECONDS",
        help="with --wait: seconds to wait at most, then exit 124 (default: no limit)",
    )
    result.add_argument(
        "--json",
        action="store_true",
        help='print {"job_id", "state", ...} as JSON, whatever the state: '
        'a result JSON can hold as "result", any other as its repr '
        'in "result_repr"; a failure as "error" with its "type", '
        '"message" and the worker\'s "traceback" (null when none)',
    )
