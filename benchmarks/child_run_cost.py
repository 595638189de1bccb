"""What one child driver run of the test suite costs (CPU and wall), and what changes it.

    .venv/bin/python benchmarks/child_run_cost.py [--runs 3] [--variants base,lazy,...]

Every crash test starts pipelines as ``python -m flinkish_spark.runner SPEC`` in a child process
(conftest's ``run_pipeline``): a Python driver, a driver JVM and its Python workers. This runs
the suite's typical spec (``flinkish.sequence`` 900 rows in 6 epochs -> ``flinkish.parquet``,
AvailableNow) alternately under each variant, ``--runs`` times each, and reports the median
CPU seconds of the whole process tree (the children's rusage: CPU hardly depends on what else
the machine runs, wall time does) and the median wall time.

Variants (a code variant runs the package from another folder through PYTHONPATH):

* ``base``: as the suite runs it;
* ``eager``: the package from ``--eager-path`` (e.g. an export of the commit before lazy imports);
* ``nodaemon``: ``spark.python.use.daemon=false``;
* ``noreuse``: ``spark.python.worker.reuse=false``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import print_table, write_results  # noqa: E402

from flinkish_spark.runner import child_spec  # noqa: E402


def spec(tmp: str, conf: dict[str, str]) -> dict[str, Any]:
    return child_spec({
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": f"{tmp}/meta", "rowsPerSplit": "500,400", "maxRowsPerTrigger": 150}},
        "sink": {"format": "flinkish.parquet", "checkpointLocation": f"{tmp}/cp",
                 "options": {"uid": "out", "path": f"{tmp}/out", "rowsPerFile": 50}},
        "register": ["flinkish_spark.testing.sources:register_test_sources"],
        "conf": conf,
    })


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {},
    "eager": {"pythonpath": True},
    "nodaemon": {"conf": {"spark.python.use.daemon": "false"}},
    "noreuse": {"conf": {"spark.python.worker.reuse": "false"}},
}


def become_subreaper() -> None:
    """Orphaned descendants (the driver JVM outlives the Python driver by a moment, daemons
    their JVM) become our children instead of init's: reaped here, their CPU time counts."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_CHILD_SUBREAPER) failed: CPU of orphaned processes would be lost")


def reap_orphans(timeout: float = 60.0) -> None:
    """Wait for every descendant left (each adds its CPU time to RUSAGE_CHILDREN when reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                raise SystemExit("descendants still running after the run ended")
            time.sleep(0.05)


def run_once(variant: str, eager_path: str | None) -> dict[str, float]:
    v = VARIANTS[variant]
    with tempfile.TemporaryDirectory(prefix="child-run-") as tmp:
        path = os.path.join(tmp, "spec.json")
        with open(path, "w") as f:
            json.dump(spec(tmp, v.get("conf", {})), f)
        env = dict(os.environ)
        if v.get("pythonpath"):
            if not eager_path:
                raise SystemExit("the variant 'eager' needs --eager-path")
            env["PYTHONPATH"] = eager_path
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "flinkish_spark.runner", path], env=env, capture_output=True,
                             text=True, cwd=tmp, start_new_session=True)
        wall = time.monotonic() - t0
        reap_orphans()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if out.returncode != 0 or "QUERY_END=finished" not in out.stdout:
            raise SystemExit(f"{variant}: the run failed:\n{(out.stdout + out.stderr)[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--variants", default="base,nodaemon")
    parser.add_argument("--eager-path", help="a folder holding another flinkish_spark package (variant 'eager')")
    parser.add_argument("--name", default="child_run_cost")
    args = parser.parse_args()
    variants = args.variants.split(",")
    become_subreaper()
    results: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for i in range(args.runs):
        for v in variants:
            r = run_once(v, args.eager_path)
            results[v].append(r)
            print(f"run {i + 1} {v}: cpu {r['cpu_s']:.1f} s, wall {r['wall_s']:.1f} s", flush=True)
    rows = []
    base = statistics.median(r["cpu_s"] for r in results[variants[0]])
    for v in variants:
        cpu = statistics.median(r["cpu_s"] for r in results[v])
        wall = statistics.median(r["wall_s"] for r in results[v])
        rows.append([v, f"{cpu:.1f}", f"{cpu / base:.2f}", f"{wall:.1f}", " ".join(f"{r['cpu_s']:.1f}" for r in results[v])])
    print()
    print_table(["variant", "median CPU s", f"vs {variants[0]}", "median wall s", "CPU s of each run"], rows)
    print("written:", write_results(args.name, {"runs": args.runs, "results": results}))


if __name__ == "__main__":
    main()
