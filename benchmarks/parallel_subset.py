"""A few of the suite's tests serially (``-n 0``) and on xdist workers (``-n 2``), alternating.

    .venv/bin/python benchmarks/parallel_subset.py [--runs 2] [--workers 2] [TEST_ID ...]

Default tests: six crash tests of different connectors (child drivers, kills, restarts). Runs
``python -m pytest -p no:cacheprovider -n 0 TESTS`` and ``... -n WORKERS --dist load TESTS``
alternately, ``--runs`` times each, and prints pytest's own time ("... in 123.4s"), the wall
time, the children's rusage CPU seconds (only processes that were waited for: pytest, its
workers and what they reaped -- not the JVMs of drivers killed by process group, so an
undercount; benchmarks/suite_profile.py samples every process) and the pass counts, with
medians and the parallel/serial ratio; writes ``benchmarks/results/parallel_subset.json``.

The machine is shared and timing is noisy: only a ratio of alternating runs means anything.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import print_table, write_results

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEFAULT_TESTS = [
    # (the PostgreSQL matrices and random upsert kills, and the Delta matrices, are one test each since suite-crash)
    "tests/connectors/postgres/test_sink_crash.py::test_crash_matrices_and_random_upsert_kills",
    "tests/connectors/delta/test_crash.py::test_crash_matrices_and_random_kills_on_s3_with_failed_first_attempts",
    "tests/connectors/test_spark_files_crash.py::test_task_failure_in_first_attempt_leaves_nothing_visible",
    "tests/sink/test_sink_crash.py::test_foreach_batch_replay_is_not_applied_twice",
    "tests/finish/test_stop.py::test_cli_stop_and_drain_from_a_second_process",
]


def run_once(tests: list[str], workers: int) -> dict[str, Any]:
    dist = ["-n", "0"] if workers == 0 else ["-n", str(workers), "--dist", "load"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *dist, *tests],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    took = re.search(r" in ([0-9.]+)s", summary)
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", summary)}
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-2000:], file=sys.stderr)
    return {"workers": workers, "exit": proc.returncode, "pytest_s": float(took.group(1)) if took else None,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for workers in (0, args.workers):
            r = run_once(args.tests, workers)
            runs.append(r)
            print(f"run {i + 1}: -n {workers}: {r}", flush=True)
    rows = [[f"-n {r['workers']}", r["pytest_s"], r["wall_s"], r["cpu_s"], r.get("passed", 0), r.get("failed", 0),
             r.get("skipped", 0)] for r in runs]
    medians = {}
    for workers in (0, args.workers):
        times = [r["pytest_s"] for r in runs if r["workers"] == workers and r["pytest_s"] is not None]
        medians[workers] = statistics.median(times) if times else None
    print_table(["run", "pytest s", "wall s", "CPU s", "passed", "failed", "skipped"], rows)
    ratio = medians[args.workers] / medians[0] if medians[0] and medians[args.workers] else None
    print(f"median pytest s: -n 0 {medians[0]}, -n {args.workers} {medians[args.workers]}; "
          f"ratio {ratio and round(ratio, 2)}")
    path = write_results("parallel_subset", {"tests": args.tests, "runs": runs, "medians": medians, "ratio": ratio})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
