"""The report: benchmarks/latest.json -> the results block of README.md, and the CDF chart.

``latest.json`` keeps the newest result of every benchmark (a run with ``--only`` replaces
just the ones it ran), so README.md is always rebuilt whole from it. The hand-written parts
of README.md live outside the ``results`` markers and are kept as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from benchmarks._common import HERE, Metric, Section, Target, median, summarise

LATEST = HERE / "latest.json"
README = HERE / "README.md"
CHART = HERE / "lateness_cdf.png"
EFFICIENCY_CHART = HERE / "efficiency.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
ORDER = [
    "throughput",
    "lateness",
    "scaling",
    "idle",
    "herd",
    "scale",
    "durable",
    "payloads",
    "recurring",
    "redis",
    "cpu",
    "breakdown",
]


def save(sections: list[Section], run: dict[str, Any]) -> dict[str, Any]:
    """Merge this run's sections into latest.json; returns the merged document."""
    latest: dict[str, Any] = json.loads(LATEST.read_text()) if LATEST.exists() else {}
    latest.setdefault("sections", {})
    for section in sections:
        record = asdict(section)
        record.pop("samples")
        record.pop("curves")
        record["run"] = run
        latest["sections"][section.key] = record
    latest["last_run"] = run
    LATEST.write_text(json.dumps(latest, indent=1, ensure_ascii=False) + "\n")
    return latest


def render(latest: dict[str, Any]) -> str:
    """The markdown between the results markers."""
    run = latest["last_run"]
    sections = [latest["sections"][k] for k in ORDER if k in latest["sections"]]
    lines = [
        f"Last run: `{run['command']}` on {run['date']} ({run['minutes']:.1f} min).",
        "",
        "Machine: " + "; ".join(f"{k} {v}" for k, v in run["machine"].items()) + ".",
        "",
        "Every value is the median over repeats with the (min\u2013max) range; comparisons "
        "(ratios, differences) are taken per repeat between contenders run back to back, "
        "then summarised the same way. Contenders alternate inside each repeat, the order "
        "rotated by one each time.",
        "",
        "### Targets",
        "",
        "| goal | measured | met |",
        "|---|---|:-:|",
    ]
    for section in sections:
        for target in section["targets"]:
            lines.append(_target_row(Target(**target)))
    for section in sections:
        lines += ["", *_section(section)]
    return "\n".join(lines)


def _target_row(target: Target) -> str:
    mark = {True: "yes", False: "**no**", None: "n/a"}[target.met]
    return f"| {target.goal} | {target.measured} | {mark} |"


def _section(section: dict[str, Any]) -> list[str]:
    run = section["run"]
    lines = [
        f"### {section['title']}",
        "",
        section["setup"],
        "",
        f"*{run['repeats']} repeats, {run['date']}, `{run['command']}`, "
        f"{section['seconds']:.0f} s; 1-min load average (this run included) "
        f"{section['load']}.*",
        "",
        "| contender | metric | median (min\u2013max) |",
        "|---|---|---:|",
    ]
    for raw in section["metrics"]:
        metric = Metric(**raw)
        unit = f" {metric.unit}" if metric.unit else ""
        lines.append(
            f"| {metric.contender} | {metric.name} | "
            f"{summarise(metric.values, metric.digits)}{unit} |"
        )
    lines += [f"\n{note}" for note in section["notes"]]
    if section["key"] == "lateness" and CHART.exists():
        lines += ["", f"![lateness CDF per scheduler]({CHART.name})"]
    if section["key"] == "cpu" and EFFICIENCY_CHART.exists():
        lines += ["", f"![efficiency against job length per pool]({EFFICIENCY_CHART.name})"]
    return lines


def write_readme(latest: dict[str, Any]) -> None:
    content = README.read_text() if README.exists() else _skeleton()
    if BEGIN not in content:
        content += f"\n{BEGIN}\n{END}\n"
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{render(latest)}\n{END}{tail}")


def _skeleton() -> str:
    return (
        "# Benchmarks\n\n`python benchmarks/run.py` (or `make bench`) writes the "
        f"results below.\n\n## Results\n\n{BEGIN}\n{END}\n"
    )


def chart(samples: dict[str, list[float]], title: str) -> None:
    """A CDF of lateness (ms, log scale) per scheduler, pooled over repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for name, values in samples.items():
        ran = sorted(max(v, 1e-3) for v in values if v != float("inf"))
        if not ran:
            continue
        fraction = [(i + 1) / len(values) for i in range(len(ran))]
        ax.step(ran, fraction, where="post", label=f"{name} (n={len(values):,})")
    ax.set_xscale("log")
    ax.set_xlabel("lateness: job start minus due instant (ms, log scale; ≤ 1 µs drawn at 1 µs)")
    ax.set_ylabel("fraction of jobs started")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.axhline(0.99, color="grey", linewidth=0.8, linestyle=":")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(CHART)
    plt.close(fig)


def efficiency_chart(curves: dict[str, dict[str, list[float]]], title: str) -> None:
    """Efficiency against job length (ms, log scale) per pool: median and min-max bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for name, points in curves.items():
        xs = sorted(points, key=float)
        medians = [median(points[x]) for x in xs]
        low = [m - min(points[x]) for m, x in zip(medians, xs, strict=True)]
        high = [max(points[x]) - m for m, x in zip(medians, xs, strict=True)]
        ax.errorbar(
            [float(x) for x in xs], medians, yerr=[low, high], marker="o", capsize=3, label=name
        )
    ax.set_xscale("log")
    ticks = sorted({float(x) for points in curves.values() for x in points})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_xlabel("CPU per job (ms, log scale); N x length = the same CPU in every run")
    ax.set_ylabel("efficiency: jobs' own CPU ÷ 2 cores ÷ wall time")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(EFFICIENCY_CHART)
    plt.close(fig)
