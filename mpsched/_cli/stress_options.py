"""The options of ``stress``: how hard to flood a manager, and a shared Redis store whose
managers the run kills and restarts."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from mpsched._cli import values
from mpsched._cli.options import KEY_HELP, tls_options
from mpsched._core.options import Option


class Injection(Option):
    """A fault ``stress --inject`` plants in the run log before verifying it: it exists only
    to prove the verifier catches it (a test runs each and expects FAIL)."""

    DUPLICATE = "duplicate"  # the log's first key, once more
    LOSS = "loss"  # the log's first key, dropped


def stress_options(stress: argparse.ArgumentParser) -> None:
    """The options of ``stress``, in the order its --help lists them."""
    stress.add_argument(
        "--producers",
        type=values.count,
        default=3,
        help="producer processes submitting at once (default: %(default)s)",
    )
    stress.add_argument(
        "--workers",
        type=values.count,
        default=2,
        help="worker processes of the manager started for the run; ignored "
        "with --connect (default: %(default)s)",
    )
    stress.add_argument(
        "--jobs",
        type=values.count,
        default=3000,
        help="jobs in all, shared by the producers (default: %(default)s)",
    )
    stress.add_argument(
        "--horizon",
        type=values.seconds_or_zero,
        default=2.0,
        metavar="SECONDS",
        help="each job is due a random 0 to SECONDS after its submission (default: %(default)s)",
    )
    stress.add_argument(
        "--connect", metavar="ADDRESS", help="flood this running manager instead of starting one"
    )
    stress.add_argument(
        "--authkey-file", type=Path, metavar="FILE", help=f"with --connect: {KEY_HELP}"
    )
    tls_options(stress, serving=False)
    _shared_store_options(stress)
    stress.add_argument(
        "--inject", choices=values.words(Injection), help=argparse.SUPPRESS
    )  # proves the verifier catches faults


def _shared_store_options(stress: argparse.ArgumentParser) -> None:
    """A run on several managers of one Redis store, one killed now and then."""
    shared = stress.add_argument_group(
        "several managers on one Redis store",
        textwrap.fill(
            "With --store URL, the run starts --managers serve processes on that Redis store "
            "(each with --workers workers), the producers connect to them in turn, and every "
            "--kill-every seconds one manager is killed with its workers and started again: "
            "every job must still run once (or, if its manager died as it ran, at most once, "
            "failing with WorkerCrashedError).",
            77,
        ),
    )
    shared.add_argument(
        "--store",
        metavar="URL",
        help="a Redis URL (redis://, rediss://, unix://); needs mpsched[redis]",
    )
    shared.add_argument(
        "--managers",
        type=values.count,
        default=3,
        help="managers on the store (default: %(default)s)",
    )
    shared.add_argument(
        "--kill-every",
        type=values.seconds,
        metavar="SECONDS",
        help="SIGKILL a manager this often, then start it again (default: never)",
    )
    shared.add_argument(
        "--lease-timeout",
        type=values.seconds,
        default=2.0,
        metavar="SECONDS",
        help="each manager's lease: how soon its peers take back what a "
        "killed one ran (default: %(default)s)",
    )
