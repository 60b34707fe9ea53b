"""Profile mpsched's dispatch path: the throughput benchmark under py-spy, by process.

    python benchmarks/profile_dispatch.py [--jobs N] [--rate HZ] [--readme]

Runs ``--workload`` (N no-op jobs on 2 workers, after a warm-up) under
``py-spy record --subprocesses --format raw`` (idle threads are not sampled, so a sample is
a moment a thread was busy), then folds the stacks by process role (client,
manager, worker) and, inside each, by step of a job's life. Writes the raw stacks to
benchmarks/results/ and, with ``--readme``, the summary between the
``<!-- profile-API[-FLAGS]:begin/end -->`` markers of benchmarks/README.md.

``--py-spy-option=--gil`` samples only the thread holding each process's GIL: time spent
running Python. Without it every thread py-spy does not judge idle is sampled; here that
includes threads blocked in a socket read, so that view is closer to wall time per thread.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.append(str(HERE.parent))  # appended: a PYTHONPATH snapshot of mpsched wins

from benchmarks._common import measured_package_root  # noqa: E402

RESULTS = HERE / "results"

# Steps of a job's life, matched against a stack (outermost first) in this order; the
# first rule whose pattern occurs anywhere in the stack wins. Patterns are py-spy frame
# names ("function (file:line)").
STEPS: dict[str, list[tuple[str, str]]] = {
    "client": [
        ("result thread: collect + resolve futures", r"_collect_loop|_resolve"),
        ("submit: cloudpickle the job", r"pickle_job|cloudpickle.*dumps"),
        (
            "submit: sender thread, proxy call (pickle, send, wait for reply)",
            r"_send \(mpsched|_send_batch|_callmethod|Outbox\._run",
        ),
        ("submit: Future/bookkeeping", r"_schedule \(mpsched|new_future|JobFuture|map \(mpsched"),
        ("waiting for futures / results", r"wait \(concurrent|_MapResults|__next__"),
    ],
    "manager": [
        ("submit: JobQueue.submit (heap push, lock)", r"JobQueue\.submit|JobQueue\._push"),
        ("take: JobQueue.take (heap pop, lease, prefetch, condition)", r"JobQueue\.take"),
        (
            "take: hand-out records (leases to wire, check-in)",
            r"Dispatch\.take|WorkerTable\.check_in",
        ),
        (
            "complete: report, JobQueue.complete, ended-job record, mailbox post",
            r"JobQueue\.complete|Mailboxes\.post|Endings\.|NoJournal\.finished"
            r"|ManagerService\._complete|report_from_wire",
        ),
        ("result: mailbox collect", r"Mailboxes\.collect|collect \(mpsched"),
        ("other service methods", r"ManagerService\."),
        ("server thread: receive + unpickle request", r"recv|_loads|loads"),
        ("server thread: pickle + send reply", r"send|_dumps|dumps"),
        ("server thread: dispatch (serve_client)", r"serve_client"),
        ("supervisor / accept", r"watch|accepter|Supervisor"),
    ],
    "worker": [
        ("hold a report (and wake the idle reporter thread)", r"Reports\.hold|_Batches\._hold"),
        ("claim a prefetched job (shared-memory slot)", r"_claim_or_stop|ClaimSlot"),
        ("run the job (unpickle, call, pickle result)", r"run \(mpsched/_worker|_run_one"),
        (
            "take: proxy call (pickle report, send, wait)",
            r"take \(mpsched|_callmethod|Reports\.take_all|delivered",
        ),
        ("lifeline / other threads", r"_exit_with_manager|lifeline"),
    ],
}


def workload(jobs: int, api: str) -> None:
    """The throughput benchmark's mpsched run, alone."""
    from concurrent.futures import wait

    from benchmarks._common import scheduler
    from benchmarks.jobs import noop, noop_arg

    with scheduler(workers=2) as s:
        wait([s.submit(noop) for _ in range(200)])
        start = time.perf_counter()
        if api == "map":
            list(s.map(noop_arg, range(jobs)))
        else:
            wait([s.submit(noop) for _ in range(jobs)])
        elapsed = time.perf_counter() - start
    print(f"{jobs} jobs in {elapsed:.2f} s: {jobs / elapsed:,.0f} jobs/s", file=sys.stderr)


def record(jobs: int, api: str, rate: int, out: Path, extra: list[str]) -> None:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    cmd = [
        py_spy,
        "record",
        "--subprocesses",
        *extra,
        "--format",
        "raw",
        "--rate",
        str(rate),
        "--output",
        str(out),
        "--",
        sys.executable,
        __file__,
        "--workload",
        "--jobs",
        str(jobs),
        "--api",
        api,
    ]
    subprocess.run(cmd, check=True, cwd=measured_package_root())


def _split(line: str) -> tuple[list[str], list[str], int] | None:
    """A raw line -> (process chain, frames, count)."""
    stack, _, count = line.rstrip().rpartition(" ")
    if not count.isdigit():
        return None
    parts = stack.split(";")
    procs = [p for p in parts if p.startswith("process ")]
    frames = [p for p in parts if not p.startswith("process ") and not p.startswith("thread ")]
    return procs, frames, int(count)


def fold(raw: Path) -> dict[str, Counter[str]]:
    """Samples per (role, step); roles found from what each process runs."""
    lines = [s for s in (_split(line) for line in raw.read_text().splitlines()) if s]
    role_of: dict[str, str] = {}
    for procs, frames, _ in lines:
        pid = procs[-1].split(":")[0] if procs else "?"
        text = ";".join(frames)
        if "worker_main" in text:
            role_of[pid] = "worker"
        elif "run_manager" in text or "serve_client" in text:
            role_of.setdefault(pid, "manager")
        elif len(procs) == 1:
            role_of.setdefault(pid, "client")
    folded: dict[str, Counter[str]] = defaultdict(Counter)
    for procs, frames, count in lines:
        pid = procs[-1].split(":")[0] if procs else "?"
        role = role_of.get(pid, "other (forkserver, resource tracker)")
        folded[role][_step(role, ";".join(frames))] += count
    return folded


def _step(role: str, stack: str) -> str:
    for name, pattern in STEPS.get(role, []):
        if re.search(pattern, stack):
            return name
    return "other"


def summary(folded: dict[str, Counter[str]], rate: int, jobs: int, label: str) -> str:
    """A markdown table: samples per role and step, as µs per job."""
    total = sum(sum(c.values()) for c in folded.values())
    lines = [
        f"{label}: py-spy at {rate} Hz, {jobs:,} no-op jobs on 2 workers, {total:,} "
        "samples. µs per job = samples ÷ rate ÷ jobs.",
        "",
        "| process | step | share of samples | ≈ µs per job |",
        "|---|---|---:|---:|",
    ]
    for role in ("client", "manager", "worker"):
        counter = folded.get(role, Counter())
        role_total = sum(counter.values())
        lines.append(
            f"| **{role}** | *all* | **{role_total / total:.0%}** | "
            f"**{role_total / rate / jobs * 1e6:.0f}** |"
        )
        for step, n in counter.most_common():
            lines.append(f"| | {step} | {n / total:.1%} | {n / rate / jobs * 1e6:.0f} |")
    other = sum(
        sum(c.values()) for r, c in folded.items() if r not in ("client", "manager", "worker")
    )
    lines.append(f"| other processes | | {other / total:.1%} | |")
    return "\n".join(lines)


def top_frames(raw: Path, role_pids: dict[str, str] | None = None, limit: int = 15) -> str:
    """The hottest leaf frames overall (self time), for the curious."""
    leaves: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        parsed = _split(line)
        if parsed and parsed[1]:
            leaves[parsed[1][-1]] += parsed[2]
    total = sum(leaves.values())
    rows = [f"| {name} | {n / total:.1%} |" for name, n in leaves.most_common(limit)]
    return "\n".join(["| leaf frame (self time) | share |", "|---|---:|", *rows])


def write_readme(text: str, name: str) -> None:
    """Replace the block between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    readme = HERE / "README.md"
    content = readme.read_text() if readme.exists() else ""
    if begin not in content:
        content += f"\n{begin}\n{end}\n"
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{begin}\n{text}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=250, help="samples per second")
    parser.add_argument(
        "--api",
        choices=("submit", "map"),
        default="submit",
        help="how the jobs are queued: one submit() each, or one map()",
    )
    parser.add_argument("--workload", action="store_true", help="run the workload only")
    parser.add_argument("--raw", type=Path, help="analyse this raw file instead of recording")
    parser.add_argument("--readme", action="store_true", help="write into README.md")
    parser.add_argument(
        "--py-spy-option",
        action="append",
        default=[],
        dest="extra",
        help="passed to py-spy record (e.g. --nonblocking, --gil)",
    )
    args = parser.parse_args(argv)
    if args.workload:
        workload(args.jobs, args.api)
        return 0
    flags = "".join(f.strip("-").replace("-", "") for f in args.extra)
    name = f"profile-{args.api}{'-' + flags if flags else ''}"
    raw = args.raw
    if raw is None:
        RESULTS.mkdir(exist_ok=True)
        raw = RESULTS / f"{name}.txt"
        record(args.jobs, args.api, args.rate, raw, args.extra)
    label = f"`{args.api}`, py-spy {' '.join(args.extra) or '(all threads)'}"
    text = summary(fold(raw), args.rate, args.jobs, label) + "\n\n" + top_frames(raw)
    print(text)
    if args.readme:
        write_readme(text, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
