"""The command line's grammar: subcommands, options, help texts and exit codes.

``build_parser()`` describes ``python -m mpsched``; :mod:`mpsched._cli.main` runs what it
parses. Every option has a help text that names its unit; a test holds them to it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import textwrap
from collections.abc import Sequence
from typing import NoReturn

from mpsched._cli.options import client_options
from mpsched._cli.query_options import (
    cancel_options,
    jobs_options,
    result_options,
    schedules_options,
    status_options,
)
from mpsched._cli.serve_options import serve_options, worker_options
from mpsched._cli.stress_options import stress_options
from mpsched._cli.submit_options import submit_options
from mpsched._core.options import Option
from mpsched._protocol.records import Exit
from mpsched._transport.authkey import AUTHKEY_ENV
from mpsched._transport.sockets import describe_versions


class Command(Option):
    """The subcommands of ``python -m mpsched``, in the order --help lists them."""

    SERVE = "serve"
    WORKER = "worker"
    DRAIN_WORKERS = "drain-workers"
    SUBMIT = "submit"
    STATUS = "status"
    JOBS = "jobs"
    SCHEDULES = "schedules"
    CANCEL = "cancel"
    REQUEUE = "requeue"
    RESULT = "result"
    DEMO = "demo"
    STRESS = "stress"


EXIT_MEANINGS = {
    Exit.OK: "ok",
    Exit.FAILURE: "the job failed or was cancelled (submit --wait, result), result or "
    "cancel of a job unknown or no longer pending, or stress found a fault",
    Exit.USAGE: "usage: bad arguments, an optional dependency missing (cronsim for --cron, "
    "here or in the manager), or serve cannot listen on its address",
    Exit.AUTH: "key: none given, a key file or runtime directory others can use, or the "
    "manager refused it",
    Exit.VERSION: "version: Python or cloudpickle differs from the manager's",
    Exit.UNREACHABLE: "unreachable: unknown host, nothing listening, not an mpsched "
    "manager, or one that closed every handshake tried for 10 s (busy; "
    "a worker keeps trying)",
    Exit.UNSAFE: "unsafe: serve on a non-loopback address without an explicit authkey, or "
    "--http on one without --http-token-file and TLS",
    Exit.STORE: "store: serve cannot open its --store (missing or read-only directory, "
    "not an mpsched store, another manager holds it; a Redis server that does "
    "not answer, refuses the password, is too old or may evict keys)",
    Exit.RUNNING: "running: serve without --address, while this user's local manager runs "
    "(the message names its pid)",
    Exit.JOB_TIMEOUT: "result: the job has not finished (without --wait, or within "
    "--timeout); also a remote worker process that killed its job past "
    "its timeout",
    Exit.INTERRUPTED: "128 + SIGINT (Ctrl-C); submit --wait and result --wait stop "
    "waiting and leave the job as it is, queued or running",
    Exit.TERMINATED: "128 + SIGTERM: a second one to serve or worker (the first drains, exits 0)",
}

EPILOG_KEY = textwrap.fill(
    f"keys: --authkey-file names a file only its owner can read (chmod 600) holding the "
    f"key: the file's bytes, surrounding whitespace such as a trailing newline stripped. "
    f"Or set ${AUTHKEY_ENV} to the key. Never on the command line.",
    width=79,
)

EPILOG = "\n".join(
    [
        "exit codes:",
        *(
            textwrap.fill(
                meaning, width=79, initial_indent=f"  {int(code):<4} ", subsequent_indent=" " * 7
            )
            for code, meaning in EXIT_MEANINGS.items()
        ),
        "",
        EPILOG_KEY,
        "",
        textwrap.fill(
            "local manager: serve without --address is this user's local manager, on a socket "
            "in the per-user runtime directory ($XDG_RUNTIME_DIR/mpsched, else "
            "mpsched-<uid> in the temp directory); the other commands without --connect "
            "connect to it. A serve given no key uses this user's local key, kept in that "
            "directory across restarts (mode 0600), and so does a client of a Unix socket or "
            "loopback address given no key.",
            width=79,
        ),
    ]
)


PROG = "python -m mpsched"


def _json_guess(words: list[str]) -> list[object]:
    """``words`` as JSON values where they read as one (``5``, ``true``), else strings."""
    guessed: list[object] = []
    for word in words:
        try:
            guessed.append(json.loads(word))
        except ValueError:
            guessed.append(word)
    return guessed


def usage_line(message: str, command: str | None) -> str:
    """A usage error as the command line prints it: one line, and where the help is."""
    return f"mpsched: {message}; see {PROG}{f' {command}' if command else ''} --help"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and a pointer to ``--help``, as every
    other usage error of the command line, instead of the whole usage text."""

    commands: dict[str, argparse.ArgumentParser]  # the subcommands' parsers, by name

    def error(self, message: str) -> NoReturn:
        command = self.prog[len(PROG) :].strip() or None
        self.exit(Exit.USAGE, usage_line(message, command) + "\n")

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """``parse_args``, with arguments it does not know blamed on the subcommand they
        were given to, so that the pointer to ``--help`` is to that command's."""
        args, unknown = self.parse_known_args(argv)
        if unknown:
            blamed = getattr(self, "commands", {}).get(args.command, self)
            hint = ""
            if args.command == "submit" and not any(a.startswith("-") for a in unknown):
                # What a newcomer types first: the function's arguments after it.
                hint = (
                    f" (the function's arguments go in --args as a JSON list: "
                    f"--args '{json.dumps(_json_guess(unknown))}')"
                )
            blamed.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
        return args


def build_parser() -> Parser:
    """The parser of ``python -m mpsched``; ``args.command`` is the subcommand (a
    :class:`Command`, None without one)."""
    parser = Parser(
        prog=PROG,
        description="Run Python jobs at a scheduled time, in priority order, on worker processes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=_version(),
        help="print the versions of mpsched, Python and cloudpickle",
    )
    parser.set_defaults(command=None)
    commands = _Commands(parser)
    _running_commands(commands)
    _query_commands(commands)
    _job_commands(commands)
    _tool_commands(commands)
    parser.commands = commands.parsers()
    return parser


class _Commands:
    """The subcommands of the parser, in the order ``--help`` lists them."""

    def __init__(self, parser: Parser) -> None:
        self._sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def add(
        self, name: Command, help: str, example: str, key: bool = True, codes: str = ""
    ) -> argparse.ArgumentParser:
        """A subcommand's parser, its help ending with ``example``, the key's note (with
        ``key``) and its exit ``codes``."""
        epilog = f"example:\n  {example}"
        if key:
            epilog += f"\n\n{EPILOG_KEY}"
        codes = textwrap.fill(
            f"exit codes: {codes}; others: see python -m mpsched --help"
            if codes
            else "exit codes: see python -m mpsched --help",
            79,
        )
        p = self._sub.add_parser(
            str(name),
            help=help,
            description=help,
            epilog=f"{epilog}\n\n{codes}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.set_defaults(command=name)
        p.add_argument(
            "--log-level",
            default="warning",
            choices=["debug", "info", "warning", "error"],
            help="what to log on stderr (default: %(default)s)",
        )
        return p

    def parsers(self) -> dict[str, argparse.ArgumentParser]:
        return dict(self._sub.choices)


def _running_commands(commands: _Commands) -> None:
    """The commands that run a manager, join one with workers, or give it work."""
    command = commands.add
    serve_options(
        command(
            Command.SERVE,
            "run a manager with local workers",
            "python -m mpsched serve\n"
            "  python -m mpsched serve --address 127.0.0.1:7000 --workers 4 --store jobs.db\n"
            "  python -m mpsched serve --http 8080",
            codes="7 the store cannot be opened, 8 this user's local manager is already running",
        )
    )
    worker_options(
        command(
            Command.WORKER,
            "join a running manager with worker processes (they join it again after it restarts)",
            "python -m mpsched worker --processes 2\n"
            "  python -m mpsched worker --connect 10.0.0.5:7000 --authkey-file key",
        )
    )
    client_options(
        command(
            Command.DRAIN_WORKERS,
            "tell the worker pools of a manager to leave: running jobs finish, each pool exits 0",
            "python -m mpsched drain-workers --connect 10.0.0.5:7000 --authkey-file key",
            codes="0 told (every pool connected now; none may be)",
        )
    )
    submit_options(
        command(
            Command.SUBMIT,
            "submit an importable callable, once or on a schedule",
            "python -m mpsched submit math:factorial --args '[20]' --delay 5 --wait\n"
            "  python -m mpsched submit time:time --cron '30 2 * * 1-5' --tz Europe/Berlin "
            "--id nightly",
        )
    )


def _query_commands(commands: _Commands) -> None:
    """The commands that ask a running manager about its jobs and schedules."""
    command = commands.add
    status_options(
        client_options(
            command(
                Command.STATUS,
                "show queue, workers, lateness and the job store",
                "python -m mpsched status --json",
            )
        )
    )
    jobs_options(
        client_options(
            command(
                Command.JOBS,
                "list the manager's jobs: pending, running, and finished ones it keeps",
                "python -m mpsched jobs --state pending",
            )
        )
    )
    schedules_options(
        client_options(
            command(
                Command.SCHEDULES,
                "list the manager's recurring schedules: spec, next run, counters",
                "python -m mpsched schedules --json",
            )
        )
    )


def _job_commands(commands: _Commands) -> None:
    """The commands that act on one job of a running manager, by its id."""
    command = commands.add
    cancel_options(
        client_options(
            command(
                Command.CANCEL,
                "cancel a pending job (it will not run) or a schedule (no run starts "
                "after it; a running one finishes)",
                "python -m mpsched cancel 3f2a1b4c5d6e-17",
                codes="0 cancelled, 1 not pending (running, finished, or unknown)",
            )
        )
    )
    cancel_options(
        client_options(
            command(
                Command.REQUEUE,
                "run a failed or cancelled job again: pending, due now, under its "
                "id, with its options and no attempt made",
                "python -m mpsched requeue 3f2a1b4c5d6e-17",
                codes="0 requeued (its id printed), 1 not failed or cancelled (pending, running, "
                "done, or unknown)",
            )
        )
    )
    result_options(
        client_options(
            command(
                Command.RESULT,
                "print a job's result (as JSON, or its repr when JSON cannot hold "
                "it), or why it failed with the worker's traceback",
                "python -m mpsched result 3f2a1b4c5d6e-17 --wait",
                codes="0 done (the result printed), 1 failed, cancelled or unknown (no result will "
                "come), 124 not finished yet",
            )
        )
    )


def _tool_commands(commands: _Commands) -> None:
    """The commands that show mpsched at work, a demo and a stress run."""
    command = commands.add
    command(
        Command.DEMO,
        "a live demo: 4 producer processes submit 12 jobs due in 1, 2 and "
        "3 s at mixed priorities; 3 workers start them by due time, then "
        "priority",
        "python -m mpsched demo",
        key=False,
    )  # it runs its own manager: no key
    stress_options(
        command(
            Command.STRESS,
            "flood a manager and verify exactly-once, none early",
            "python -m mpsched stress --producers 3 --workers 4 --jobs 5000",
        )
    )


def _version() -> str:
    try:
        mpsched = importlib.metadata.version("mpsched")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        mpsched = "(not installed)"
    cloudpickle = describe_versions()[1]
    return f"mpsched {mpsched} (Python {platform.python_version()}, cloudpickle {cloudpickle})"
