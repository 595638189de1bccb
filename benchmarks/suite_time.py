"""The whole test suite of two revisions, side by side: fresh clones, `CI=true bash .ci/run`, alternating.

    python3 benchmarks/suite_time.py BASE HEAD [--runs 2] [--workdir DIR] [--repo PATH]
    python3 benchmarks/suite_time.py e086214 suite-speed --runs 2
    python3 benchmarks/suite_time.py e086214 main --same-scenarios   # HEAD runs only BASE's tests

With ``--same-scenarios`` HEAD runs BASE's tests by their HEAD ids (renamed paths; a parameter
HEAD added in front of a parametrization, ``--param``) and not the tests added since: the time of
the same scenarios, which is what "the suite got faster" means once later work added tests.

Clones both revisions of ``--repo`` (default: this checkout) into fresh folders, sets each up once
(``./dev test --collect-only``: the .venv and the JVM class archive, not timed), compares the
two test lists (``--collect-only -q``, with ``--rename OLD=NEW`` path prefixes applied to BASE's),
then runs ``CI=true bash .ci/run`` alternately (BASE, HEAD, BASE, HEAD, ...) ``--runs`` times each.
Prints a table of pytest's own time ("... in 1234.5s"), the command's wall time, and the pass /
fail / skip counts, with the medians and HEAD/BASE ratio; writes
``benchmarks/results/suite_time.json`` (and each run's output next to the clones).

Run it on an otherwise idle machine: the suite's time depends on the machine and on what else
runs, so only a ratio measured in one session, alternating, means anything.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from _common import print_table  # no pyspark import: this script runs under any python3

HERE = os.path.dirname(os.path.abspath(__file__))

# Test files moved after e086214 (one folder per table format); same tests, new paths.
DEFAULT_RENAMES = [
    "tests/connectors/test_delta_sink.py=tests/connectors/delta/test_sink.py",
    "tests/connectors/test_delta_crash.py=tests/connectors/delta/test_crash.py",
    "tests/connectors/test_iceberg_sink.py=tests/connectors/iceberg/test_sink.py",
    "tests/connectors/test_iceberg_crash.py=tests/connectors/iceberg/test_crash.py",
    "tests/connectors/test_delta.py=tests/connectors/delta/test_sink.py",
    "tests/connectors/test_iceberg.py=tests/connectors/iceberg/test_sink.py",
]

# Parametrizations added after e086214 around the same scenario: the PostgreSQL tests also run on
# PostgreSQL 15 now (e086214 ran them on 18 only: `[pg18]` is the old case), and the demo test
# also runs through Spark Connect (`[local]` is the old case).
DEFAULT_PARAMS = ["pg18", "local"]


def sh(cmd: list[str], cwd: str | None = None, env: dict[str, str] | None = None, log: str | None = None) -> tuple[int, str]:
    out = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout)
    return out.returncode, out.stdout


def clone(repo: str, rev: str, dest: str) -> str:
    for cmd in (["git", "clone", "-q", "--no-local", repo, dest], ["git", "-C", dest, "checkout", "-q", rev]):
        rc, text = sh(cmd)
        if rc != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{text}")
    return sh(["git", "-C", dest, "rev-parse", "--short", "HEAD"])[1].strip()


def collect(dest: str) -> list[str]:
    rc, text = sh(["./dev", "test", "--collect-only", "-q", "-p", "no:cacheprovider"], cwd=dest)
    if rc != 0:
        raise SystemExit(f"collection failed in {dest}:\n{text[-3000:]}")
    return [line.strip() for line in text.splitlines() if "::" in line]


def renamed(ids: list[str], renames: list[str]) -> list[str]:
    pairs = [r.split("=", 1) for r in renames]
    out = []
    for test in ids:
        for old, new in pairs:
            if test.startswith(old):
                test = new + test[len(old):]
        out.append(test)
    return out


def same_scenario(test: str, head: set[str], params: list[str]) -> str | None:
    """HEAD's id of BASE's ``test`` (already renamed): the same id, or the one with a new parameter in front."""
    if test in head:
        return test
    for p in params:
        candidate = test.replace("[", f"[{p}-", 1) if "[" in test else f"{test}[{p}]"
        if candidate in head:
            return candidate
    return None


def parse_summary(text: str) -> dict[str, Any]:
    """pytest's last line: '=== 218 passed, 2 skipped in 1234.56s (0:20:34) ==='."""
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error)", ln) and " in " in ln]
    if not lines:
        return {"pytest_s": None}
    last = lines[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)}
    m = re.search(r" in ([\d.]+)s", last)
    return {"pytest_s": float(m.group(1)) if m else None, **counts}


def write_results(name: str, payload: dict[str, Any]) -> str:
    """Like _common.write_results, without importing pyspark (this script runs under any python3)."""
    import platform

    path = os.path.join(HERE, "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
               "load_avg_at_end": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    with open(path, "w") as f:
        json.dump({"machine": machine, **payload}, f, indent=2)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base")
    parser.add_argument("head")
    parser.add_argument("--runs", type=int, default=2, help="runs of each revision (default 2)")
    parser.add_argument("--repo", default=os.path.dirname(HERE), help="the repository to clone (default: this checkout)")
    parser.add_argument("--workdir", help="where the clones go (default: a new temporary folder)")
    parser.add_argument("--rename", action="append", default=None,
                        help="OLD=NEW test path prefix applied to BASE's test list (repeatable; default: the delta/iceberg move)")
    parser.add_argument("--param", action="append", default=None,
                        help="a parameter HEAD added in front of BASE's parametrizations (repeatable; default: pg18, local)")
    parser.add_argument("--same-scenarios", action="store_true",
                        help="HEAD runs only BASE's tests (their HEAD ids), not the tests added since: the time of the "
                             "same scenarios; `.ci/run`'s command with the ids in a file")
    parser.add_argument("--name", default="suite_time", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    renames = DEFAULT_RENAMES if args.rename is None else args.rename
    work = args.workdir or tempfile.mkdtemp(prefix="suite-time-")
    os.makedirs(work, exist_ok=True)

    revs = {"base": args.base, "head": args.head}
    dirs = {k: os.path.join(work, k) for k in revs}
    commits = {}
    for k, rev in revs.items():
        print(f"clone {rev} -> {dirs[k]}", flush=True)
        commits[k] = clone(args.repo, rev, dirs[k])
    print("set up both clones (.venv, JVM class archive) and list their tests", flush=True)
    tests = {k: collect(d) for k, d in dirs.items()}
    params = DEFAULT_PARAMS if args.param is None else args.param
    head_ids = set(tests["head"])
    mapped = {t: same_scenario(t, head_ids, params) for t in renamed(tests["base"], renames)}
    base_ids = {t for t in mapped.values() if t}
    missing, added = sorted(t for t, h in mapped.items() if h is None), sorted(head_ids - base_ids)
    ids_file = os.path.join(work, "base-scenarios.txt")
    with open(ids_file, "w") as f:
        f.write("".join(f"{t}\n" for t in sorted(base_ids)))
    print(f"tests: base {len(base_ids)}, head {len(head_ids)}; only in base {len(missing)}, only in head {len(added)}")
    for t in missing:
        print(f"  - {t}")
    for t in added:
        print(f"  + {t}")

    runs: list[dict[str, Any]] = []
    env = {**os.environ, "CI": "true"}
    for i in range(args.runs):
        for k in ("base", "head"):
            log = os.path.join(work, f"{k}-run{i + 1}.log")
            print(f"run {i + 1}/{args.runs} of {k} ({revs[k]} = {commits[k]}) ...", flush=True)
            t0 = time.time()
            # .ci/run is `./dev test -p no:cacheprovider`; the same with BASE's scenarios as pytest's @file
            cmd = (["./dev", "test", "-p", "no:cacheprovider", f"@{ids_file}"] if args.same_scenarios and k == "head"
                   else ["bash", ".ci/run"])
            rc, text = sh(cmd, cwd=dirs[k], env=env, log=log)
            row = {"rev": k, "commit": commits[k], "run": i + 1, "exit": rc, "wall_s": round(time.time() - t0, 1),
                   **parse_summary(text), "log": log}
            runs.append(row)
            print(f"  exit {rc}, pytest {row['pytest_s']} s, wall {row['wall_s']} s, "
                  f"passed {row.get('passed', 0)} failed {row.get('failed', 0)} skipped {row.get('skipped', 0)}", flush=True)

    print()
    print_table(["rev", "commit", "run", "exit", "pytest s", "wall s", "passed", "failed", "skipped"],
                [[r["rev"], r["commit"], r["run"], r["exit"], r["pytest_s"], r["wall_s"], r.get("passed", 0),
                  r.get("failed", 0) + r.get("error", 0) + r.get("errors", 0), r.get("skipped", 0)] for r in runs])
    med = {k: statistics.median([r["pytest_s"] for r in runs if r["rev"] == k and r["pytest_s"] is not None] or [float("nan")])
           for k in revs}
    ratio = med["head"] / med["base"] if med["base"] else float("nan")
    green = all(r["exit"] == 0 and not r.get("skipped") for r in runs)
    print(f"\nmedian pytest time: base {med['base']:.0f} s, head {med['head']:.0f} s; head/base = {ratio:.2f}; "
          f"every run green with nothing skipped: {green}")
    path = write_results(args.name, {"base": revs["base"], "head": revs["head"], "commits": commits, "runs": runs,
                                     "median_pytest_s": med, "ratio": ratio, "all_green_no_skips": green,
                                     "head_runs": "base's scenarios only" if args.same_scenarios else "its whole suite",
                                     "tests": {"base": len(base_ids), "head": len(head_ids), "only_in_base": missing,
                                               "only_in_head": added}})
    print(f"wrote {path}")
    sys.exit(0 if green and not missing else 1)


if __name__ == "__main__":
    main()
