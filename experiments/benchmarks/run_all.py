"""Runs every benchmark in experiments/benchmarks/ and writes BENCHMARKS.md: the machine, the commit, each command, its
figures, and its ratios against the peers and the goals.

    .venv/bin/pip install -e '.[bench]'   # the peers (setup.py's "bench" extra): run_all refuses to start without
    .venv/bin/python -m experiments.benchmarks.run_all [--quick] [--only lm,envs] [--out BENCHMARKS.md]

A benchmark is every module of this folder but this one and those whose name starts with an underscore (helpers).
Each runs in its own process from the repository root, one after another, as `python -m experiments.benchmarks.NAME`,
with `--quick` when run_all has it (every benchmark takes it). Its JSON line is the last line of its stdout that
parses as a JSON object; its stderr streams to ours (each line prefixed with its name) and its tail is kept. A script
that exits non-zero or prints no JSON line is reported as failed, with its stderr tail, and the run goes on.
BENCHMARKS.md (at the repository root unless --out) is rewritten after every benchmark, so an interrupted run keeps
what finished. It holds:
  the date, the commit (`git rev-parse HEAD`, and whether tracked files differ from it), quick or full, the machine
  (CPU model, cores, memory, load average at the start, package versions, jax's devices, asked in a child process
  so that this one never holds an accelerator);
  a summary table: benchmark, status, wall seconds, goals met;
  per benchmark: the exact command, exit status and wall time, a table of its goal figures (value, bound, met; the
  script's `GOALS`, `_goals.py`) and of its other ratio figures (a figure whose last key contains "ratio", "_vs_" or
  "_over_": ours against the peer measured in the same run), and the whole JSON line.
Progress goes to stderr.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from experiments.benchmarks._goals import bound, figure, met, read_goals
from experiments.provenance import git_commit

FOLDER = Path(__file__).resolve().parent
ROOT = FOLDER.parent.parent
PACKAGE = "experiments.benchmarks"
RATIO_MARKS = ("ratio", "_vs_", "_over_")
STDERR_TAIL = 30  # lines kept of a benchmark's stderr
VERSIONS = ("jax", "jaxlib", "numpy", "torch", "transformers", "gymnasium", "gym-sokoban")
INTRO = ("Written by `python -m experiments.benchmarks.run_all` (experiments/benchmarks/run_all.py); each benchmark's "
         "docstring says what it measures. A benchmark's table lists its goals, then its other ratio figures; a ratio "
         "against a peer is ours / the peer's, both measured in the same process.")
DEVICES = "import jax; d = jax.devices(); print(f'{len(d)} x {d[0].platform} ({d[0].device_kind})')"


@dataclasses.dataclass
class Run:
    """One benchmark's run: its name, the command as shown, exit status, wall seconds, JSON line (None if none was
    printed), the tail of its stderr and its GOALS."""

    name: str
    command: str
    returncode: int
    wall_s: float
    result: dict | None
    stderr_tail: str
    goals: dict

    @property
    def status(self) -> str:
        if self.returncode:
            return f"failed (exit {self.returncode})"
        return "ok" if self.result is not None else "failed (no JSON line)"


def discover(folder: Path = FOLDER) -> list[str]:
    """The benchmark names of `folder`, sorted: its modules but run_all and the underscored helpers."""
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "run_all")


def command(name: str, quick: bool) -> list[str]:
    return [sys.executable, "-m", f"{PACKAGE}.{name}", *(["--quick"] if quick else [])]


def shown(argv: list[str]) -> str:
    """The command as a shell line, the interpreter relative to the repository root when it lies inside it."""
    python = Path(argv[0])
    if python.is_absolute() and ROOT in python.parents:
        python = python.relative_to(ROOT)
    return shlex.join([str(python), *argv[1:]])


def json_line(stdout: str) -> dict | None:
    """The last line of `stdout` that parses as a JSON object, or None."""
    for line in reversed(stdout.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def numbers(result: dict, prefix: str = "") -> list[tuple[str, float]]:
    """(dotted path, value) of every number in a JSON result, in its order (booleans are no numbers)."""
    out = []
    for key, value in result.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(numbers(value, path + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((path, value))
    return out


def is_ratio(path: str) -> bool:
    return any(mark in path.rsplit(".", 1)[-1] for mark in RATIO_MARKS)


def number(value: float) -> str:
    """A figure as the report prints it: thousands separated, four significant digits below 1000."""
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def goal_text(spec) -> str:
    operator, limit = bound(spec)
    return f"{'≥' if operator == '>=' else '≤'} {number(limit)}"


def met_text(value, spec) -> str:
    return {True: "yes", False: "**no**", None: "not measured"}[met(value, spec)]


def goals_summary(run: Run) -> str:
    """"k of n" goals met ("-" without goals), noting those not measured."""
    if not run.goals:
        return "-"
    if run.result is None:
        return f"0 of {len(run.goals)} (not measured)"
    verdicts = [met(figure(run.result, path), spec) for path, spec in run.goals.items()]
    missing = verdicts.count(None)
    return f"{verdicts.count(True)} of {len(verdicts)}" + (f" ({missing} not measured)" if missing else "")


def figure_rows(run: Run) -> list[str]:
    """The markdown table rows of a run's goals (first) and its other ratio figures."""
    rows = [f"| {path} | {'-' if figure(run.result, path) is None else number(figure(run.result, path))} | "
            f"{goal_text(spec)} | {met_text(figure(run.result, path), spec)} |" for path, spec in run.goals.items()]
    rows += [f"| {path} | {number(value)} | | |" for path, value in numbers(run.result)
             if is_ratio(path) and path not in run.goals]
    return rows


def section(run: Run) -> list[str]:
    """The markdown lines of one benchmark."""
    lines = [f"## {run.name}", "", f"`{run.command}`: {run.status}, {run.wall_s:.1f} s", ""]
    if run.result is None:
        return lines + ["stderr (tail):", "", "```text", run.stderr_tail.rstrip(), "```", ""]
    rows = figure_rows(run)
    if rows:
        lines += ["| figure | value | goal | met |", "|---|---|---|---|", *rows, ""]
    return lines + ["<details><summary>JSON line</summary>", "", "```json", json.dumps(run.result), "```", "",
                    "</details>", ""]


def report(header: list[tuple[str, str]], runs: list[Run]) -> str:
    """BENCHMARKS.md: the header table (date, commit, machine: (label, text) pairs), the summary, one section each."""
    lines = ["# Benchmarks", "", INTRO, "", "| | |", "|---|---|", *(f"| {k} | {v} |" for k, v in header), "",
             "## Summary", "", "| benchmark | status | wall (s) | goals met |", "|---|---|---|---|"]
    lines += [f"| [{r.name}](#{r.name}) | {r.status} | {r.wall_s:.1f} | {goals_summary(r)} |" for r in runs]
    lines.append("")
    for run in runs:
        lines += section(run)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ running
def _meminfo_gib() -> str:
    with open("/proc/meminfo") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return f"{kib / 2 ** 20:.1f} GiB"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_peers(distribution: str = "ragen-jax") -> list[str]:
    """The requirements of `distribution`'s "bench" extra (setup.py) that are not installed, as `name==version`."""
    extra = re.compile(r"""extra\s*==\s*["']bench["']""")
    wanted = [r.split(";")[0].strip() for r in importlib.metadata.requires(distribution) or [] if extra.search(r)]
    return [r for r in wanted if _version(re.split(r"[=<>!~ ]", r)[0]) is None]


def header(quick: bool) -> list[tuple[str, str]]:
    """(label, text) of the date, commit, mode and machine."""
    commit, dirty = git_commit()
    devices = subprocess.run([sys.executable, "-c", DEVICES], cwd=ROOT, capture_output=True, text=True)
    versions = [f"{p} {v}" for p in VERSIONS if (v := _version(p))]
    return [
        ("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")),
        ("commit", commit + (" (tracked files modified)" if dirty else "")),
        ("mode", "quick (`--quick`)" if quick else "full"),
        ("CPU", _cpu_model()),
        ("cores", f"{os.cpu_count()} ({len(os.sched_getaffinity(0))} usable)"),
        ("memory", _meminfo_gib()),
        ("load average at start", ", ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("software", ", ".join([f"Python {platform.python_version()}", *versions])),
        ("jax devices", devices.stdout.strip() or f"(failed: {devices.stderr.strip().splitlines()[-1:]})"),
    ]


def run_one(name: str, quick: bool) -> Run:
    """Runs benchmark `name` in a child process, streaming its stderr (prefixed) to ours."""
    argv = command(name, quick)
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def pump():
        for line in child.stderr:
            tail.append(line)
            print(f"  [{name}] {line}", end="", file=sys.stderr, flush=True)

    reader = threading.Thread(target=pump)
    reader.start()
    stdout = child.stdout.read()
    returncode = child.wait()
    reader.join()
    goals = read_goals((FOLDER / f"{name}.py").read_text(encoding="utf-8"))
    return Run(name, shown(argv), returncode, time.perf_counter() - start, json_line(stdout), "".join(tail), goals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    parser.add_argument("--only", help="comma-separated benchmark names (default: all)")
    parser.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"), help="the report file")
    args = parser.parse_args()
    names = discover()
    if args.only:
        unknown = sorted(set(args.only.split(",")) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(names)}")
        names = [n for n in names if n in args.only.split(",")]
    if missing := missing_peers():
        parser.error(f"the peers are not installed ({', '.join(missing)}): .venv/bin/pip install -e '.[bench]'")
    top = header(args.quick)
    runs = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}: {shown(command(name, args.quick))}", file=sys.stderr, flush=True)
        runs.append(run_one(name, args.quick))
        print(f"[{i}/{len(names)}] {name}: {runs[-1].status} in {runs[-1].wall_s:.1f} s", file=sys.stderr, flush=True)
        Path(args.out).write_text(report(top, runs), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
