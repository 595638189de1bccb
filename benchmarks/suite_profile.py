"""Where the test suite's time goes: per test wall time, CPU seconds by process kind, driver JVM
starts, Python interpreter starts, server starts.

    .venv/bin/python benchmarks/suite_profile.py [--label NAME] [-- PYTEST ARGS]

runs ``python -m pytest -p suite_profile PYTEST ARGS`` (default: the whole suite) and prints
tables by test file and by what the time went to; writes
``benchmarks/results/suite_profile-<label>.json``.

How it counts (so that a loaded, shared machine still gives useful figures):

* **CPU seconds** of every process descending from the pytest process (and of the embedded
  PostgreSQL, which daemonises), sampled from ``/proc`` every 0.5 s and charged to the test that
  was running; CPU time hardly depends on what else the machine runs, wall time does.
* **driver JVM starts**: new ``java ... SparkSubmit`` processes among those descendants.
* **Python interpreter starts**: a ``.pth`` hook, installed into this interpreter's
  site-packages for the run only, appends one line per interpreter start (fork()ed Spark
  workers are not new interpreters and are not counted -- they pay no import cost).
* **server starts**: the set-up time of the session fixtures (spark, postgres, s3 ...).

Works under pytest-xdist too (one sampler per worker; a worker runs one test at a time).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from typing import Any, Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ENV_LOG = "FLINKISH_PROFILE_LOG"  # the .pth hook's log of interpreter starts
ENV_OUT = "FLINKISH_PROFILE_OUT"  # the plugin's per-test records (one file per pytest process)
HOOK_MODULE = "_flinkish_suite_profile_hook"
HOOK_SOURCE = '''\
import os
if os.environ.get("FLINKISH_PROFILE_LOG"):
    try:
        import time
        with open("/proc/self/cmdline", "rb") as _f:
            _cmd = _f.read().replace(b"\\0", b" ").decode(errors="replace").strip()
        with open(os.environ["FLINKISH_PROFILE_LOG"], "a") as _f:
            _f.write("%.3f\\t%s\\t%s\\t%s\\n" % (time.time(), os.environ.get("PYTEST_XDIST_WORKER", "master"),
                                             os.getpid(), _cmd))
    except OSError:
        pass
'''
POLL = 0.5
CLK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- classification


def kind_of(cmd: str, pid: int, root: int) -> str:
    if pid == root:
        return "pytest"
    if "java" in cmd.split(" ", 1)[0]:
        return "driver JVM" if "SparkSubmit" in cmd else "other JVM"
    if "pyspark.daemon" in cmd or "pyspark." in cmd:
        return "Spark Python workers"
    if "flinkish_spark.runner" in cmd:
        return "child driver (Python)"
    if "moto.server" in cmd or "moto_server" in cmd:
        return "moto"
    if "postgres" in cmd.split(" ", 1)[0] or cmd.startswith("postgres:"):
        return "postgres"
    if "mypy" in cmd:
        return "mypy"
    return "other"


def python_start_kind(cmd: str) -> str:
    if "flinkish_spark.runner" in cmd:
        return "runner (child driver)"
    if "-m pytest" in cmd or "xdist" in cmd or "execnet" in cmd:
        return "pytest"
    if "pyspark.daemon" in cmd:
        return "pyspark.daemon"
    if "pyspark." in cmd:
        return cmd.split("-m ", 1)[-1].split(" ", 1)[0] if "-m " in cmd else "pyspark (other)"
    if "moto" in cmd:
        return "moto"
    if "mypy" in cmd:
        return "mypy"
    return "other"


# ---------------------------------------------------------------- the pytest plugin


class _Sampler:
    def __init__(self) -> None:
        self.root = os.getpid()
        self.current = "(between tests)"
        self.cpu: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.jvms: collections.Counter = collections.Counter()
        self.extra_roots: set[str] = set()  # data folders of the embedded PostgreSQL
        self._seen: dict[tuple[int, str], float] = {}
        self._kind: dict[tuple[int, str], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="suite-profile")
        self._thread.start()

    def _procs(self) -> Iterator[tuple[int, int, str, float, str]]:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            rest = stat[stat.rfind(")") + 2:].split()
            # fields after comm: state ppid ... utime(14th overall = index 11 here) stime(12) ... starttime(19)
            yield int(entry), int(rest[1]), rest[19], (int(rest[11]) + int(rest[12])) / CLK, stat

    def _cmd(self, pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            return ""

    def sample(self) -> None:
        procs = list(self._procs())
        children: dict[int, list[int]] = collections.defaultdict(list)
        info = {}
        for pid, ppid, start, cpu, _ in procs:
            children[ppid].append(pid)
            info[pid] = (start, cpu)
        wanted: set[int] = set()
        todo = [self.root]
        if self.extra_roots:
            for pid, ppid, start, cpu, _ in procs:
                if ppid == 1 and any(r in self._cmd(pid) for r in self.extra_roots):
                    todo.append(pid)
        while todo:
            p = todo.pop()
            if p in wanted:
                continue
            wanted.add(p)
            todo.extend(children.get(p, ()))
        bucket = self.cpu[self.current]
        for pid in wanted:
            if pid not in info:
                continue
            start, cpu = info[pid]
            key = (pid, start)
            # Re-read until known: spark-submit is a shell script that exec()s java (same pid).
            if self._kind.get(key, "other") == "other":
                kind = kind_of(self._cmd(pid), pid, self.root)
                self._kind[key] = kind
                if kind == "driver JVM":
                    self.jvms[self.current] += 1
            prev = self._seen.get(key, 0.0)
            bucket[self._kind[key]] += cpu - prev
            self._seen[key] = cpu

    def _loop(self) -> None:
        while not self._stop.wait(POLL):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - a sampler never fails the suite
                pass

    def switch(self, test: str) -> None:
        self.sample()  # charge what ran so far to the previous test
        self.current = test

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()


class SuiteProfilePlugin:
    def __init__(self) -> None:
        self.sampler = _Sampler()
        self.tests: dict[str, dict[str, Any]] = {}
        self.fixtures: list[dict[str, Any]] = []
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "master")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        self.sampler.switch(item.nodeid)
        start = time.time()
        yield
        end = time.time()
        self.sampler.switch("(between tests)")
        rec = self.tests.setdefault(item.nodeid, {"phases": {}})
        rec.update(start=start, end=end, wall=end - start, worker=self.worker)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Iterator[None]:
        start = time.time()
        outcome = yield
        if fixturedef.scope in ("session", "module", "package"):
            self.fixtures.append({"fixture": fixturedef.argname, "scope": fixturedef.scope,
                                  "seconds": time.time() - start, "test": request.node.nodeid})
        if fixturedef.argname == "postgres":
            try:
                embedded = outcome.get_result().embedded
                if embedded is not None:
                    self.sampler.extra_roots.add(str(embedded.data_dir))
            except Exception:  # noqa: BLE001
                pass

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        rec = self.tests.setdefault(report.nodeid, {"phases": {}})
        rec["phases"][report.when] = report.duration
        if report.when == "call" or report.outcome != "passed":
            rec["outcome"] = report.outcome if report.when == "call" or report.outcome == "failed" else rec.get("outcome", report.outcome)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.sampler.close()
        out = os.environ.get(ENV_OUT)
        if not out:
            return
        for nodeid, cpu in self.sampler.cpu.items():
            self.tests.setdefault(nodeid, {"phases": {}})["cpu"] = {k: round(v, 2) for k, v in cpu.items()}
        for nodeid, n in self.sampler.jvms.items():
            self.tests.setdefault(nodeid, {"phases": {}})["driver_jvm_starts"] = n
        with open(f"{out}.{self.worker}.{os.getpid()}.json", "w") as f:
            json.dump({"worker": self.worker, "tests": self.tests, "fixtures": self.fixtures}, f)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(ENV_OUT) and not config.pluginmanager.has_plugin("suite-profile-sampler"):
        config.pluginmanager.register(SuiteProfilePlugin(), "suite-profile-sampler")


# ---------------------------------------------------------------- the command


def group_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def aggregate(parts: list[dict[str, Any]], starts: list[tuple[float, str, int, str]]) -> dict[str, Any]:
    tests: dict[str, dict[str, Any]] = {}
    windows: dict[str, list[tuple[float, float, str]]] = collections.defaultdict(list)
    fixtures = []
    for part in parts:
        fixtures.extend(part["fixtures"])
        for nodeid, rec in part["tests"].items():
            if "start" in rec:
                windows[rec["worker"]].append((rec["start"], rec["end"], nodeid))
            tests.setdefault(nodeid, {}).update(rec)
    for t, worker, _pid, cmd in starts:
        owner = "(between tests)"
        for s, e, nodeid in windows.get(worker, ()):
            if s <= t <= e:
                owner = nodeid
                break
        counts = tests.setdefault(owner, {}).setdefault("python_starts", {})
        k = python_start_kind(cmd)
        counts[k] = counts.get(k, 0) + 1
    return {"tests": tests, "fixtures": fixtures}


def report(data: dict[str, Any]) -> dict[str, Any]:
    from _common import print_table

    tests = data["tests"]
    by_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    kinds: collections.Counter = collections.Counter()
    starts: collections.Counter = collections.Counter()
    for nodeid, rec in tests.items():
        f = by_file[group_of(nodeid)]
        f["tests"] += 1 if "wall" in rec else 0
        f["wall"] += rec.get("wall", 0.0)
        f["cpu"] += sum(rec.get("cpu", {}).values())
        f["jvms"] += rec.get("driver_jvm_starts", 0)
        f["py"] += sum(v for k, v in rec.get("python_starts", {}).items() if k not in ("pytest",))
        f["slow"] += 1 if rec.get("slow") else 0
        kinds.update(rec.get("cpu", {}))
        starts.update(rec.get("python_starts", {}))
    total_wall = sum(r.get("wall", 0.0) for r in tests.values())
    rows = sorted(by_file.items(), key=lambda kv: -kv[1]["wall"])
    print(f"\nby test file (wall = setup+call+teardown; total {total_wall / 60:.1f} min)")
    print_table(["file", "tests", "wall s", "share", "CPU s", "driver JVMs", "py starts"],
                [[k, v["tests"], f"{v['wall']:.0f}", f"{v['wall'] / total_wall:.0%}", f"{v['cpu']:.0f}", v["jvms"], v["py"]]
                 for k, v in rows])
    total_cpu = sum(kinds.values())
    print(f"\nCPU seconds by process kind (total {total_cpu:.0f} s)")
    print_table(["kind", "CPU s", "share"], [[k, f"{v:.0f}", f"{v / total_cpu:.0%}"] for k, v in kinds.most_common()])
    print("\nPython interpreter starts by kind")
    print_table(["kind", "starts"], [[k, v] for k, v in starts.most_common()])
    print("\nslowest tests")
    slow = sorted(((r.get("wall", 0.0), k, r) for k, r in tests.items()), key=lambda x: -x[0])[:40]
    print_table(["test", "wall s", "CPU s", "JVMs", "py starts"],
                [[k, f"{w:.1f}", f"{sum(r.get('cpu', {}).values()):.0f}", r.get("driver_jvm_starts", 0),
                  sum(r.get("python_starts", {}).values())] for w, k, r in slow])
    fx = collections.defaultdict(list)
    for f in data["fixtures"]:
        fx[f["fixture"]].append(f["seconds"])
    print("\nsession/module fixture set-ups")
    print_table(["fixture", "times", "total s"], [[k, len(v), f"{sum(v):.1f}"] for k, v in sorted(fx.items(), key=lambda kv: -sum(kv[1]))])
    return {"total_wall_s": total_wall, "cpu_by_kind": dict(kinds), "python_starts": dict(starts),
            "by_file": {k: dict(v) for k, v in by_file.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", default="run")
    parser.add_argument("--keep", help="folder to keep the raw logs in")
    parser.add_argument("--report", metavar="DIR", help="only report on the raw logs a run kept in DIR (--keep)")
    parser.add_argument("pytest_args", nargs="*")
    args = parser.parse_args()
    sys.path.insert(0, HERE)
    if args.report:
        summarise(args.report, args.label, None, None, args.pytest_args)
        return
    site = sysconfig.get_paths()["purelib"]
    hook_py, hook_pth = os.path.join(site, HOOK_MODULE + ".py"), os.path.join(site, "zz" + HOOK_MODULE + ".pth")
    work = args.keep or tempfile.mkdtemp(prefix="suite-profile-")
    os.makedirs(work, exist_ok=True)
    log, out = os.path.join(work, "python-starts.tsv"), os.path.join(work, "tests")
    with open(hook_py, "w") as f:
        f.write(HOOK_SOURCE)
    with open(hook_pth, "w") as f:
        f.write(f"import {HOOK_MODULE}\n")
    env = {**os.environ, ENV_LOG: log, ENV_OUT: out,
           "PYTHONPATH": os.pathsep.join([HERE, *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.time()
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", "-p", "suite_profile", "-p", "no:cacheprovider",
                              *args.pytest_args], env=env)
    finally:
        os.unlink(hook_pth)
        os.unlink(hook_py)
    summarise(work, args.label, rc, time.time() - t0, args.pytest_args)
    sys.exit(rc)


def summarise(work: str, label: str, rc: int | None, elapsed: float | None, pytest_args: list[str]) -> None:
    log, out = os.path.join(work, "python-starts.tsv"), os.path.join(work, "tests")
    parts = []
    for path in glob.glob(out + ".*.json"):
        with open(path) as f:
            parts.append(json.load(f))
    starts = []
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t", 3)
                if len(fields) == 4 and fields[2].isdigit():  # a command line with a newline in it continues here
                    starts.append((float(fields[0]), fields[1], int(fields[2]), fields[3]))
    data = aggregate(parts, starts)
    summary = report(data)
    from _common import write_results

    path = write_results(f"suite_profile-{label}", {"pytest_exit": rc, "elapsed_s": elapsed,
                                                     "pytest_args": pytest_args, "summary": summary, **data})
    print(f"\npytest exit {rc}; wrote {path}")


if __name__ == "__main__":
    main()
