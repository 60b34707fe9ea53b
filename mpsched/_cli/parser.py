"""The command line's grammar: subcommands, options, help texts and exit codes.

``build_parser()`` describes ``python -m mpsched``; :mod:`mpsched._cli.main` runs what it
parses. Every option has a help text that names its unit; a test holds them to it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from mpsched._core.job import JobState, Order
from mpsched._core.options import Catchup, Durability, Mode, OnError, Option, Overlap
from mpsched._core.recurring import MIN_INTERVAL, interval_problem
from mpsched._protocol.records import (
    HEARTBEAT_TIMEOUT,
    Exit,
)
from mpsched._transport.sockets import AUTHKEY_ENV, describe_versions
from mpsched._transport.tls import TlsConfig

COMMANDS = ("serve", "worker", "submit", "status", "jobs", "schedules", "cancel", "result",
            "demo",
            "stress")
STORE_ENV = "MPSCHED_STORE"

EXIT_MEANINGS = {
    Exit.OK: "ok",
    Exit.FAILURE: "the job failed or was cancelled (submit --wait, result), result or "
                  "cancel of a job unknown or no longer pending, or stress found a fault",
    Exit.USAGE: "usage: bad arguments, an optional dependency missing (cronsim for --cron, "
                "here or in the manager), or serve cannot listen on its address",
    Exit.AUTH: "key: none given, a key file or runtime directory others can use, or the "
               "manager refused it",
    Exit.VERSION: "version: Python or cloudpickle differs from the manager's",
    Exit.UNREACHABLE: "unreachable: unknown host, nothing listening, or not an mpsched "
                      "manager",
    Exit.UNSAFE: "unsafe: serve on a non-loopback address without an explicit authkey",
    Exit.STORE: "store: serve cannot open its --store (missing or read-only directory, "
                "not an mpsched store, or another manager holds it)",
    Exit.RUNNING: "running: serve without --address, while this user's local manager runs "
                  "(the message names its pid)",
    Exit.JOB_TIMEOUT: "result: the job has not finished (without --wait, or within "
                      "--timeout); also a remote worker process that killed its job past "
                      "its timeout",
    Exit.INTERRUPTED: "128 + SIGINT (Ctrl-C); submit --wait and result --wait stop "
                      "waiting and leave the job as it is, queued or running",
    Exit.TERMINATED: "128 + SIGTERM: a second one to serve or worker (the first drains, "
                     "exits 0)",
}

EPILOG_KEY = textwrap.fill(
    f"keys: --authkey-file names a file only its owner can read (chmod 600) holding the "
    f"key: the file's bytes, surrounding whitespace such as a trailing newline stripped. "
    f"Or set ${AUTHKEY_ENV} to the key. Never on the command line.", width=79)

EPILOG = "\n".join([
    "exit codes:",
    *(textwrap.fill(meaning, width=79, initial_indent=f"  {int(code):<4} ",
                    subsequent_indent=" " * 7) for code, meaning in EXIT_MEANINGS.items()),
    "",
    EPILOG_KEY,
    "",
    textwrap.fill(
        "local manager: serve without --address is this user's local manager, on a socket "
        "in the per-user runtime directory ($XDG_RUNTIME_DIR/mpsched, else "
        "mpsched-<uid> in the temp directory); the other commands without --connect "
        "connect to it. A serve given no key uses this user's local key, kept in that "
        "directory across restarts (mode 0600), and so does a client of a Unix socket or "
        "loopback address given no key.", width=79),
])


CONNECT_HELP = ("the manager's address, as serve prints it: unix:PATH or HOST:PORT "
                "(default: this user's local manager)")
KEY_HELP = (f"file holding the manager's key, mode 0600 (default: ${AUTHKEY_ENV}, else, "
            f"for a local address, this user's local key)")
PROG = "python -m mpsched"


def usage_line(message: str, command: str | None) -> str:
    """A usage error as the command line prints it: one line, and where the help is."""
    return f"mpsched: {message}; see {PROG}{f' {command}' if command else ''} --help"


def plural(count: int, noun: str) -> str:
    """``1 process``, ``2 processes``, ``0 workers``."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}{'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else 's'}"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and a pointer to ``--help``, as every
    other usage error of the command line, instead of the whole usage text."""

    commands: dict[str, argparse.ArgumentParser]  # the subcommands' parsers, by name

    def error(self, message: str) -> NoReturn:
        command = self.prog[len(PROG):].strip() or None
        self.exit(Exit.USAGE, usage_line(message, command) + "\n")

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """``parse_args``, with arguments it does not know blamed on the subcommand they
        were given to, so that the pointer to ``--help`` is to that command's."""
        args, unknown = self.parse_known_args(argv)
        if unknown:
            blamed = getattr(self, "commands", {}).get(args.command, self)
            blamed.error(f"unrecognized arguments: {' '.join(unknown)}")
        return args


def build_parser() -> Parser:
    """The parser of ``python -m mpsched``; ``args.command`` names the subcommand."""
    parser = Parser(
        prog=PROG,
        description="Run Python jobs at a scheduled time, in priority order, on worker "
                    "processes.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the versions of mpsched, Python and cloudpickle")
    parser.set_defaults(command=None)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    def command(name: str, help: str, example: str, key: bool = True,
                codes: str = "") -> argparse.ArgumentParser:
        epilog = f"example:\n  {example}"
        if key:
            epilog += f"\n\n{EPILOG_KEY}"
        codes = textwrap.fill(f"exit codes: {codes}; others: see python -m mpsched --help"
                              if codes else "exit codes: see python -m mpsched --help", 79)
        p = sub.add_parser(name, help=help, description=help,
                           epilog=f"{epilog}\n\n{codes}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(command=name)
        p.add_argument("--log-level", default="warning",
                       choices=["debug", "info", "warning", "error"],
                       help="what to log on stderr (default: %(default)s)")
        return p

    _serve_options(command("serve", "run a manager with local workers",
                           "python -m mpsched serve\n"
                           "  python -m mpsched serve --address 127.0.0.1:7000 --workers 4 "
                           "--store jobs.db",
                           codes="7 the store cannot be opened, 8 this user's local manager "
                                 "is already running"))
    _worker_options(command(
        "worker", "join a running manager with worker processes",
        "python -m mpsched worker --processes 2\n"
        "  python -m mpsched worker --connect 10.0.0.5:7000 --authkey-file key"))
    _submit_options(command("submit", "submit an importable callable, once or on a schedule",
                            "python -m mpsched submit math:factorial --args '[20]' --delay 5 "
                            "--wait\n"
                            "  python -m mpsched submit time:time --cron '30 2 * * 1-5' "
                            "--tz Europe/Berlin --id nightly"))
    status = _client_options(command(
        "status", "show queue, workers, lateness and the job store",
        "python -m mpsched status --json"))
    status.add_argument("--json", action="store_true",
                        help="print the status as JSON (times in seconds, memory and the "
                             "store's size in bytes)")
    _jobs_options(_client_options(command(
        "jobs", "list the manager's jobs: pending, running, and finished ones it keeps",
        "python -m mpsched jobs --state pending")))
    schedules = _client_options(command(
        "schedules", "list the manager's recurring schedules: spec, next run, counters",
        "python -m mpsched schedules --json"))
    schedules.add_argument("--json", action="store_true",
                           help="print the schedules as JSON (times as UTC ISO 8601; "
                                "next_run_id: the job id of the run queued for next_run, "
                                "last_run: of the latest run that started)")
    cancel = _client_options(command(
        "cancel", "cancel a pending job (it will not run) or a schedule (no run starts "
                  "after it; a running one finishes)",
        "python -m mpsched cancel 3f2a1b4c5d6e-17",
        codes="0 cancelled, 1 not pending (running, finished, or unknown)"))
    cancel.add_argument("job_id", metavar="ID",
                        help="a job's id, as submit printed it, or a schedule's id")
    _result_options(_client_options(command(
        "result", "print a job's result (as JSON, or its repr when JSON cannot hold it), "
                  "or why it failed with the worker's traceback",
        "python -m mpsched result 3f2a1b4c5d6e-17 --wait",
        codes="0 done (the result printed), 1 failed, cancelled or unknown (no result will "
              "come), 124 not finished yet")))
    command("demo", "a live demo: 4 producer processes submit 12 jobs due in 1, 2 and 3 s "
                    "at mixed priorities; 3 workers start them by due time, then priority",
            "python -m mpsched demo", key=False)  # it runs its own manager: no key
    _stress_options(command("stress", "flood a manager and verify exactly-once, none early",
                            "python -m mpsched stress --producers 3 --workers 4 --jobs 5000"))
    parser.commands = dict(sub.choices)
    return parser


def _tls_options(p: argparse.ArgumentParser, *, serving: bool) -> None:
    group = p.add_argument_group(
        "TLS (TCP addresses only; the authkey is still required)",
        "Without TLS, traffic after the authkey handshake is plaintext pickles: use it on "
        "any network you do not trust. Files are PEM." if serving else None)
    if serving:
        group.add_argument("--tls-cert", type=Path, metavar="FILE",
                           help="serve TLS with this certificate (its local workers verify "
                                "it with --tls-ca, or with the certificate itself when it "
                                "is self-signed)")
        group.add_argument("--tls-key", type=Path, metavar="FILE",
                           help="the certificate's private key (default: in --tls-cert)")
        group.add_argument("--tls-ca", type=Path, metavar="FILE",
                           help="require every client and worker to present a certificate "
                                "signed by this CA")
    else:
        group.add_argument("--tls-ca", type=Path, metavar="FILE",
                           help="connect with TLS and verify the manager's certificate with "
                                "this CA (a self-signed certificate is its own CA)")
        group.add_argument("--tls-cert", type=Path, metavar="FILE",
                           help="the client certificate to present, if the manager "
                                "requires one")
        group.add_argument("--tls-key", type=Path, metavar="FILE",
                           help="that certificate's private key (default: in --tls-cert)")


def _client_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of a command that talks to a running manager: where, key, TLS."""
    p.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    p.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    _tls_options(p, serving=False)
    return p


def _jobs_options(jobs: argparse.ArgumentParser) -> None:
    jobs.add_argument("--state", choices=[state.value for state in JobState],
                      help="only jobs in this state (default: all; finished jobs are "
                           "listed for --result-ttl seconds, in memory within bounds "
                           "without --store)")
    jobs.add_argument("--json", action="store_true",
                      help="print a JSON list; due as an ISO 8601 UTC time and due_in in "
                           "seconds from now (negative: overdue)")


def _result_options(result: argparse.ArgumentParser) -> None:
    result.add_argument("job_id", metavar="JOB_ID", help="the job's id, as submit printed it")
    result.add_argument("--wait", action="store_true",
                        help="wait until the job has finished (default: exit 124 at once if "
                             "it is still pending or running); Ctrl-C stops waiting and "
                             "leaves the job as it is, queued or running")
    result.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                        help="with --wait: seconds to wait at most, then exit 124 "
                             "(default: no limit)")
    result.add_argument("--json", action="store_true",
                        help='print {"job_id", "state", ...} as JSON, whatever the state: '
                             'a result JSON can hold as "result", any other as its repr '
                             'in "result_repr"; a failure as "error" with its "type", '
                             '"message" and the worker\'s "traceback" (null when none)')


def tls_from_args(args: argparse.Namespace) -> TlsConfig | None:
    """The TLS setting the --tls-* options ask for; None without any of them."""
    files = [getattr(args, f"tls_{name}", None) for name in ("cert", "key", "ca")]
    return None if not any(files) else TlsConfig(*files)


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--address", help="where to listen: unix:PATH or HOST:PORT (port 0: "
                                         "any free port; default: as this user's local "
                                         "manager, on the socket in the per-user runtime "
                                         "directory, where the other commands look)")
    serve.add_argument("--workers", type=_count_or_zero, default=os.cpu_count() or 1,
                       help="local worker processes (default: %(default)s, the number of "
                            "cores; 0 for remote workers only)")
    serve.add_argument("--authkey-file", type=Path, metavar="FILE",
                       help=f"file holding the key, mode 0600 (default: ${AUTHKEY_ENV}, "
                            f"else this user's local key in the runtime directory, written "
                            f"at the first serve and kept)")
    serve.add_argument("--order", choices=[o.value for o in Order], default="time",
                       help="time: earliest due first, then priority; priority: among "
                            "jobs already due, highest priority first (default: "
                            "%(default)s)")
    serve.add_argument("--max-pending", type=_count, metavar="JOBS",
                       help="most jobs waiting in the queue; a submit waits for room "
                            "(default: no limit)")
    serve.add_argument("--max-pending-bytes", type=_count, metavar="BYTES",
                       help="most bytes the payloads of waiting jobs may hold; a submit "
                            "waits for room (default: no limit)")
    serve.add_argument("--heartbeat-timeout", type=_seconds, default=HEARTBEAT_TIMEOUT,
                       metavar="SECONDS",
                       help="seconds of silence after which a remote worker is declared "
                            "gone and its jobs are requeued or failed (default: %(default)s)")
    store = serve.add_argument_group("job store", textwrap.fill(
        "Without a store, jobs live in the manager's memory and end with it. With one, a "
        "manager started again on the same file gets back its pending jobs, and its "
        "running ones are retried (if their retries allow) or failed.", 77))
    store.add_argument("--store", metavar="FILE", default=os.environ.get(STORE_ENV),
                       help=f"keep the jobs in this SQLite file, created if missing; one "
                            f"manager per file (default: ${STORE_ENV}, else in memory)")
    store.add_argument("--durability", choices=_words(Durability), default="sync",
                       help="sync: an acknowledged submit or cancel survives a power cut "
                            "(SQLite synchronous=FULL), and a job's start and end reach "
                            "the disk within milliseconds (group commit); process: they "
                            "survive a crash of the manager process, not a power cut or "
                            "an OS crash (synchronous=NORMAL, no fsync) (default: "
                            "%(default)s)")
    store.add_argument("--result-ttl", type=_seconds_or_zero, default=86400.0,
                       metavar="SECONDS",
                       help="seconds a finished job's outcome stays retrievable by its id "
                            "(result, jobs): in the store, or without one in memory (at "
                            "most 100,000 jobs and 64 MiB of outcomes, oldest dropped "
                            "first); a cancelled schedule's latest runs stay listable as "
                            "long (default: %(default)s, one day)")
    serve.add_argument("--drain-timeout", type=_seconds_or_zero, default=30.0,
                       metavar="SECONDS",
                       help="on the first SIGTERM or SIGINT, seconds running jobs may take "
                            "to finish before their workers are killed (default: "
                            "%(default)s)")
    _tls_options(serve, serving=True)


def _worker_options(worker: argparse.ArgumentParser) -> None:
    worker.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    worker.add_argument("--processes", type=_count, default=os.cpu_count() or 1,
                        help="worker processes to start (default: %(default)s, the number "
                             "of cores)")
    worker.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    worker.add_argument("--heartbeat-interval", type=_seconds, default=2.0,
                        metavar="SECONDS",
                        help="seconds between a worker's heartbeats to the manager; at most "
                             "a quarter of its heartbeat timeout (default: %(default)s)")
    _tls_options(worker, serving=False)


def _submit_options(submit: argparse.ArgumentParser) -> None:
    submit.add_argument("target", help="module:function, importable here and on the workers "
                                       "(or sent with --by-value)")
    submit.add_argument("--connect", metavar="ADDRESS", help=CONNECT_HELP)
    submit.add_argument("--authkey-file", type=Path, metavar="FILE", help=KEY_HELP)
    submit.add_argument("--args", default="[]", metavar="JSON",
                        help="JSON list of positional arguments")
    submit.add_argument("--kwargs", default="{}", metavar="JSON",
                        help="JSON object of keyword arguments")
    when = submit.add_mutually_exclusive_group()
    when.add_argument("--delay", type=float, metavar="SECONDS",
                      help="due this many seconds after the manager receives the job "
                           "(default: due now)")
    when.add_argument("--at", metavar="TIME",
                      help="due at this ISO 8601 time, as 2026-12-03T02:00 (naive means "
                           "local time)")
    submit.add_argument("--priority", choices=["high", "medium", "low"], default="medium",
                        help="among jobs due at the same time, high runs before medium "
                             "before low (default: %(default)s)")
    submit.add_argument("--timeout", type=float, metavar="SECONDS",
                        help="seconds the job may run once a worker takes it; then its "
                             "process tree is killed and the job fails (default: none)")
    submit.add_argument("--retries", type=int, default=0, metavar="N",
                        help="times to run the job again if its worker dies under it "
                             "(default: %(default)s)")
    submit.add_argument("--by-value", action="append", default=[], metavar="MODULE",
                        help="send MODULE's code with the job (pickled by value), for a "
                             "module the workers cannot import; importable here, it may be "
                             "a package (its submodules go too); repeatable")
    submit.add_argument("--key", metavar="KEY",
                        help="an idempotency key: while a job with this key is pending or "
                             "running (or its outcome kept by a store), submit prints that "
                             "job's id and queues nothing")
    _tls_options(submit, serving=False)
    submit.add_argument("--wait", action="store_true",
                        help="wait for the job and print its result: as JSON, or, when JSON "
                             "cannot hold it (a set, an object), its repr, said on stderr; "
                             "a failure prints the worker's traceback on stderr. Ctrl-C "
                             "stops waiting and leaves the job as it is, queued or running")
    recurring = submit.add_argument_group("recurring", textwrap.fill(
        "With --every or --cron the callable runs on a schedule kept by the manager (and "
        "by its store, across restarts); submit prints the schedule's id. With --every, "
        "--delay or --at sets the first run (default: one interval from now).", 77))
    how = recurring.add_mutually_exclusive_group()
    how.add_argument("--every", type=_interval, metavar="SECONDS",
                     help=f"run every SECONDS (at least {MIN_INTERVAL:g}): with --mode rate "
                          f"at start + k * SECONDS (no drift), with --mode delay SECONDS "
                          f"after the previous run ended")
    how.add_argument("--cron", metavar="EXPR",
                     help="run at the times of a five-field cron expression, as "
                          "'30 2 * * 1-5' (needs pip install 'mpsched[cron]')")
    recurring.add_argument("--tz", metavar="ZONE",
                           help="the zone --cron is read in, as Europe/Berlin (default: the "
                                "manager's local zone)")
    recurring.add_argument("--id", dest="schedule_id", metavar="NAME",
                           help="the schedule's name; submitting it again with the same "
                                "spec changes nothing, with another replaces it (default: "
                                "derived from the callable and the spec)")
    recurring.add_argument("--mode", choices=_words(Mode), default="rate",
                           help="with --every: rate plans runs at start + k * SECONDS; delay "
                                "plans each run SECONDS after the previous one ended "
                                "(default: %(default)s)")
    recurring.add_argument("--overlap", choices=_words(Overlap), default="skip",
                           help="a run due while the previous one is pending or running: "
                                "skip it, queue it until that one ends, or allow both "
                                "(default: %(default)s)")
    recurring.add_argument("--catchup", choices=_words(Catchup), default="latest",
                           help="runs missed while the manager was down or busy: run the "
                                "latest one, all of them, or none (default: %(default)s)")
    recurring.add_argument("--jitter", type=_seconds_or_zero, default=0.0, metavar="SECONDS",
                           help="start each run up to SECONDS after its time, the same "
                                "offset for a given time across restarts (default: 0)")
    recurring.add_argument("--on-error", choices=_words(OnError), default="continue",
                           help="a run that fails: continue the schedule, or pause it "
                                "(default: %(default)s)")


def _stress_options(stress: argparse.ArgumentParser) -> None:
    stress.add_argument("--producers", type=_count, default=3,
                        help="producer processes submitting at once (default: %(default)s)")
    stress.add_argument("--workers", type=_count, default=2,
                        help="worker processes of the manager started for the run; ignored "
                             "with --connect (default: %(default)s)")
    stress.add_argument("--jobs", type=_count, default=3000,
                        help="jobs in all, shared by the producers (default: %(default)s)")
    stress.add_argument("--horizon", type=_seconds_or_zero, default=2.0, metavar="SECONDS",
                        help="each job is due a random 0 to SECONDS after its submission "
                             "(default: %(default)s)")
    stress.add_argument("--connect", metavar="ADDRESS",
                        help="flood this running manager instead of starting one")
    stress.add_argument("--authkey-file", type=Path, metavar="FILE",
                        help=f"with --connect: {KEY_HELP}")
    _tls_options(stress, serving=False)
    stress.add_argument("--inject", choices=["duplicate", "loss"],
                        help=argparse.SUPPRESS)  # proves the verifier catches faults


def _version() -> str:
    try:
        mpsched = importlib.metadata.version("mpsched")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        mpsched = "(not installed)"
    cloudpickle = describe_versions()[1]
    return f"mpsched {mpsched} (Python {platform.python_version()}, cloudpickle {cloudpickle})"


def _count(text: str) -> int:
    value = _count_or_zero(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _count_or_zero(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _seconds(text: str) -> float:
    return _seconds_from(text, 0.0, inclusive=False)


def _seconds_or_zero(text: str) -> float:
    return _seconds_from(text, 0.0, inclusive=True)


def _interval(text: str) -> float:
    """``--every``: the rule ``every()`` holds an interval to, in its words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    problem = interval_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem.replace(f"{value:g}", text))
    return value


def _seconds_from(text: str, least: float, *, inclusive: bool) -> float:
    """``text`` as seconds, finite and at least (or, not ``inclusive``, more than)
    ``least``; every option of seconds says what it wants in the same words."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (value >= least if inclusive else value > least) or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"must be a finite number of seconds {'>=' if inclusive else '>'} {least:g}, "
            f"not {text}")
    return value


def _words(option: type[Option]) -> list[str]:
    """An option's words, as argparse's choices (shown in --help and its errors)."""
    return [str(member) for member in option]
