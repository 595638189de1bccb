"""One big transaction through the mirror path, and the peak memory of every process (issue 26, target 4).

On an embedded PostgreSQL, ``bench.t`` (id bigint key, v int, s text of 40 characters, ts timestamp) of
``N`` rows is mirrored as ``flinkish mirror`` runs it: ``flinkish.postgres`` with ``tables = 'bench.*'``
(``maxRowsPerTrigger`` 200,000, the mirror's default) into ``flinkish.delta`` routed by
``{schema}/{table}`` on local disk, 1 s trigger. After the snapshot is committed, ``UPDATE bench.t SET
v = v + 1`` runs in ONE transaction; the time is from its commit until every one of its rows went through
an epoch (Spark's progress), and the target is then compared with the table (count, sum of v).

Each size runs in a child process (a fresh driver: its Python, its JVM, the JVM's Python workers); this
process samples the child's process tree every 0.2 s (RSS, and ``VmHWM`` -- the kernel's own high
watermark of each process -- while it lives), separately for the snapshot and for the big transaction.
The Python processes are named by what they ran (the benchmark timers of ``benchmarks/timers``, by pid):
the source's reader (``source.read``), the sink's task (``sink.prepare``), the driver-side Python that
commits (``driver.writer_commit``, Spark's streaming Python runner of the source's planning too).

``--sink iceberg`` (a SQLite catalog, local warehouse) or ``--sink postgres`` (schema ``mirror`` of the same server)
routes to the other targets instead of Delta; ``--code DIR,DIR`` runs each size with each ``flinkish_spark`` (e.g.
the base commit's, then this worktree's), side by side in one run.

    python benchmarks/big_transaction.py [--rows 500000,1000000,2000000] [--sink delta] [--code DIR,...] [--name N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import print_table, write_results  # noqa: E402

DDL = "CREATE TABLE bench.t (id bigint PRIMARY KEY, v int NOT NULL, s text, ts timestamp)"
FILL = ("INSERT INTO bench.t SELECT g, g % 1000, md5(g::text) || 'abcdefgh', "
        "timestamp '2024-01-01' + g * interval '1 second' FROM generate_series({lo}, {hi}) g")
MIB = 2**20


# -- the child: one size -------------------------------------------------------------------------------


def phase(path: str, name: str) -> None:
    with open(path, "w") as f:
        f.write(name)


def sink_options(sink: str, url: str, work: str) -> dict[str, str]:
    """The routed sink's target options: Delta on local disk, Iceberg in a SQLite catalog, PostgreSQL in the same
    server's schema ``mirror``."""
    if sink == "delta":
        return {"path": os.path.join(work, "lake", "{schema}", "{table}")}
    if sink == "iceberg":
        return {"table": "mirror.{schema}_{table}", "catalogUri": f"sqlite:///{work}/catalog.db",
                "warehouse": f"file://{work}/wh"}
    return {"url": url, "table": "mirror.{table}"}


def start_query(spark: Any, url: str, meta: str, cp: str, sink: str, work: str, extra: dict[str, str]) -> Any:
    r = (spark.readStream.format("flinkish.postgres").option("uid", "src").option("checkpoint", meta)
         .option("url", url).option("tables", "bench.*").option("maxRowsPerTrigger", "200000"))
    for k, v in extra.items():
        r = r.option(k, v)
    w = r.load().writeStream.format(f"flinkish.{sink}").option("uid", "lake").option("checkpoint", meta)
    for k, v in sink_options(sink, url, work).items():
        w = w.option(k, v)
    return w.option("checkpointLocation", cp).trigger(processingTime="1 seconds").start()


def target_figures(sink: str, url: str, work: str, meta: str) -> tuple[int, int]:
    """(rows, sum of v) of the target, as a reader of its format sees it."""
    if sink == "postgres":
        import psycopg

        with psycopg.connect(url) as conn:
            n, total = conn.execute("SELECT count(*), sum(v) FROM mirror.t").fetchone()  # type: ignore[misc]
        return int(n), int(total)
    if sink == "iceberg":
        from flinkish_spark.mirror.compare import iceberg_reader

        opts = sink_options(sink, url, work)
        target = iceberg_reader(opts.pop("table"), opts, meta)("bench.t")
    else:
        from flinkish_spark.mirror.compare import read_delta

        target = read_delta(os.path.join(work, "lake", "bench", "t"))
    assert target is not None
    return target.num_rows, sum(x for x in target.column("v").to_pylist())


def wait_rows(q: Any, wanted: int, timeout: float) -> float:
    deadline = time.time() + timeout
    while sum(p.numInputRows for p in q.recentProgress) < wanted:
        if q.exception() is not None or not q.isActive:
            raise RuntimeError(f"the mirror failed: {q.exception()}")
        if time.time() > deadline:
            raise RuntimeError(f"timed out: {sum(p.numInputRows for p in q.recentProgress)} of {wanted} rows")
        time.sleep(0.2)
    return time.time()


def child(n: int, work: str, phase_file: str, out: str, extra: dict[str, str], sink: str = "delta") -> None:
    import psycopg

    import flinkish_spark
    from flinkish_spark.embedded.postgres import start_postgres

    phase(phase_file, "setup")
    pg = start_postgres(os.path.join(work, "data"), settings={"max_wal_size": "4GB"})
    meta, cp = (os.path.join(work, x) for x in ("meta", "cp"))
    try:
        with psycopg.connect(pg.uri, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA bench")
            conn.execute("CREATE SCHEMA mirror")
            conn.execute(DDL)
            for lo in range(1, n + 1, 500_000):
                conn.execute(FILL.format(lo=lo, hi=min(n, lo + 499_999)))
            conn.execute("VACUUM ANALYZE bench.t")
        spark = flinkish_spark.session(app_name="bench-big-txn", conf={
            "spark.sql.streaming.numRecentProgressUpdates": "100000"})
        spark.sparkContext.setLogLevel("ERROR")
        phase(phase_file, "snapshot")
        t0 = time.time()
        q = start_query(spark, pg.uri, meta, cp, sink, work, extra)
        snap_done = wait_rows(q, n, 3600)
        time.sleep(3)  # an empty epoch or two: the change split starts
        phase(phase_file, "transaction")
        with psycopg.connect(pg.uri, autocommit=True) as conn:
            t_txn = time.perf_counter()
            conn.execute("UPDATE bench.t SET v = v + 1")
            update_s = time.perf_counter() - t_txn
            committed = time.time()
        done = wait_rows(q, 2 * n, 3600)
        progress = [p for p in q.recentProgress if p.numInputRows]
        phase(phase_file, "verify")
        flinkish_spark.stop(q, drain=False, timeout=300)
        spark.stop()
        got = target_figures(sink, pg.uri, work, meta)
        with psycopg.connect(pg.uri) as conn:
            count, total = conn.execute("SELECT count(*), sum(v) FROM bench.t").fetchone()  # type: ignore[misc]
        big = max(progress, key=lambda p: p.numInputRows)
        with open(out, "w") as f:
            json.dump({"rows": n, "snapshot_s": snap_done - t0, "update_s": update_s, "txn_s": done - committed,
                       "equal": got == (int(count), int(total)), "target": got, "source": [int(count), int(total)],
                       "epochs": [{"batch": p.batchId, "rows": p.numInputRows, **p.durationMs} for p in progress],
                       "big_epoch_ms": big.durationMs, "big_epoch_rows": big.numInputRows}, f)
    finally:
        pg.stop()


# -- the parent: sampling ---------------------------------------------------------------------------------


def vm_hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Sampler:
    """Per pid: its name, command, peak RSS per phase, and its last VmHWM (life-long peak)."""

    def __init__(self, root: int, phase_file: str) -> None:
        self.root, self.phase_file = root, phase_file
        self.procs: dict[int, dict[str, Any]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.root)
        while not self.stop.is_set():
            try:
                current = open(self.phase_file).read().strip() or "setup"
            except OSError:
                current = "setup"
            try:
                procs = [root] + root.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    name = p.name()
                    if name.startswith("postgres") or name in ("pg_ctl", "initdb"):
                        continue
                    rss = p.memory_info().rss
                    known = self.procs.get(p.pid)
                    if known is None or known["name"] != name:  # first seen, or exec'd since (bash -> java)
                        info = {"name": name, "ppid": p.ppid(), "cmd": " ".join(p.cmdline())[:160]}
                        d = self.procs.setdefault(p.pid, {"peak": {}})
                        d.update(info)
                    d = self.procs[p.pid]
                except psutil.Error:
                    continue
                d["peak"][current] = max(d["peak"].get(current, 0), rss)
                hwm = vm_hwm(p.pid)
                if hwm is not None:
                    d["hwm"] = max(d.get("hwm", 0), hwm)
            time.sleep(0.2)


def roles(sampler: Sampler, timers: str) -> dict[int, str]:
    """pid -> role: the driver's Python, its JVM, and each Python worker by the calls it made."""
    made: dict[int, set[str]] = {}
    if os.path.exists(timers):
        for line in open(timers):
            t = json.loads(line)
            made.setdefault(int(t["pid"]), set()).add(t["name"])
    out = {}
    for pid, d in sampler.procs.items():
        calls = made.get(pid, set())
        if pid == sampler.root:
            out[pid] = "driver python"
        elif d["name"] == "java":
            out[pid] = "driver JVM"
        elif "sink.prepare" in calls and "source.read" in calls:
            out[pid] = "python worker: source read + sink task"
        elif "sink.prepare" in calls:
            out[pid] = "python worker: sink task"
        elif "source.read" in calls:
            out[pid] = "python worker: source read"
        elif calls:
            out[pid] = "python (driver side): " + ", ".join(sorted(calls))
        elif "pyspark.daemon" in d["cmd"]:
            out[pid] = "python worker (daemon / idle)"
        else:
            out[pid] = f"{d['name']}: {d['cmd'][:60]}"
    return out


def one(n: int, extra: dict[str, str], code: str | None = None, sink: str = "delta") -> dict[str, Any]:
    """``code``: the folder that holds the ``flinkish_spark`` to run (default: the one on ``PYTHONPATH``)."""
    work = tempfile.mkdtemp(prefix="flinkish-bench-big-txn-")
    phase_file, out, timers = (os.path.join(work, x) for x in ("phase", "out.json", "timers.jsonl"))
    env = {**os.environ, "FLINKISH_BENCH_TIMERS": timers, "PYSPARK_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "timers"), code or os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(n), "--work", work, "--sink", sink,
                             "--extra", json.dumps(extra)], env=env)
    sampler = Sampler(proc.pid, phase_file)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    rc = proc.wait()
    sampler.stop.set()
    thread.join()
    if rc != 0:
        raise RuntimeError(f"the run of {n:,} rows failed (exit {rc})")
    result = json.load(open(out))
    named = roles(sampler, timers)
    result["processes"] = sorted(
        ({"pid": pid, "role": named[pid], "snapshot_peak_mib": round(d["peak"].get("snapshot", 0) / MIB),
          "txn_peak_mib": round(d["peak"].get("transaction", 0) / MIB), "hwm_mib": round(d.get("hwm", 0) / MIB)}
         for pid, d in sampler.procs.items() if max(d["peak"].values(), default=0) > 50 * MIB),
        key=lambda r: -r["txn_peak_mib"])
    import shutil

    shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="500000,1000000,2000000")
    ap.add_argument("--name", default="big_transaction", help="results/<name>.json")
    ap.add_argument("--extra", default="{}", help="more source options, JSON")
    ap.add_argument("--code", default="", help="folders holding a flinkish_spark to run, comma-separated: each size "
                    "runs with each, side by side (e.g. a `git archive` of the base commit, then this worktree)")
    ap.add_argument("--sink", default="delta", choices=("delta", "iceberg", "postgres"), help="the routed target")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    extra = json.loads(args.extra)
    if args.child is not None:
        child(args.child, args.work, os.path.join(args.work, "phase"), os.path.join(args.work, "out.json"), extra,
              args.sink)
        return
    results = []
    codes = args.code.split(",") if args.code else [None]
    for n, code in ((int(x), c) for x in args.rows.split(",") for c in codes):
        load = os.getloadavg()[0]
        r = one(n, extra, code, args.sink)
        r["code"], r["sink"] = code, args.sink
        r["load_before"] = load
        r["load_after"] = os.getloadavg()[0]
        results.append(r)
        print(f"\n{n:,} rows into routed {args.sink}{f' ({code})' if code else ''}: snapshot {r['snapshot_s']:.1f} s; UPDATE {r['update_s']:.1f} s; its commit -> every row "
              f"through the mirror {r['txn_s']:.1f} s (epoch of {r['big_epoch_rows']:,} rows: "
              f"{r['big_epoch_ms'].get('triggerExecution')} ms); target equals source: {r['equal']}; "
              f"load {r['load_before']:.1f} -> {r['load_after']:.1f}", flush=True)
        print_table(["process", "pid", "peak RSS MiB, snapshot", "peak RSS MiB, transaction", "VmHWM MiB (life)"],
                    [(p["role"], p["pid"], p["snapshot_peak_mib"], p["txn_peak_mib"], p["hwm_mib"])
                     for p in r["processes"]])
    print("\nwrote", write_results(args.name, {"args": vars(args), "runs": results}))


if __name__ == "__main__":
    main()
