"""The MySQL source through Spark (issue 29, the acceptance's benchmark bullet): what a user of
``spark.readStream.format("flinkish.mysql")`` and ``flinkish mirror --from mysql://`` gets, side by side in one run.

On a MariaDB 10.11 of :mod:`flinkish_spark.embedded.mariadb` (row-based log, full row image and metadata), one Spark
session (``local[2]``, ``flinkish_spark.session`` with Debian's MariaDB Connector/J in ``spark.jars``):

1. **Snapshot** (``--rows``, default 1,000,000, of ``bench.t``: bigint key, int, varchar(64), decimal(12,2),
   datetime(6), double; MariaDB's sequence engine fills it). Per round, side by side:
   ``flinkish.mysql`` with ``startup=snapshot`` (bounded: the query ends by itself), ``splitSize`` rows per chunk,
   ``snapshotPartitions`` tasks, ``rowFormat`` arrow and json, into Spark's ``noop`` sink (an observed row count,
   nothing written), vs ``spark.read.jdbc`` (``jdbc:mysql://...?permitMysqlScheme``: Spark's MySQL dialect)
   partitioned by ``id`` into as many partitions as the source has chunks, into ``noop`` as well; with
   ``--delta``, also ``flinkish.mysql`` (arrow) into ``flinkish.delta`` routed by ``{schema}/{table}`` (end to end)
   vs JDBC into Delta (``format("delta")`` is not in the session: JDBC into Parquet as the reference); with
   ``--direct-pack``, also the prototype of ``benchmarks/direct_pack/`` (the chunk's typed Arrow packed as it is,
   no JSON text per row) into both sinks; with ``--json-pack``, also ``rowFormat=arrow`` the way before
   ``connectors/mysql/packed_chunks.py`` (a JSON text per row parsed back by the reader's ``Packer``, through
   ``benchmarks/direct_pack/``'s switch) into both sinks, its Delta target checked equal to the source's; with
   ``--row-loop``, also ``rowFormat=arrow`` with the row loop of ``snapshot.read_chunk`` before
   ``connectors/mysql/row_packets.py`` (the same switch). ``rowFormat=json`` only when ``--row-formats`` names it.
   Rows/s = rows / (``start()`` or the action's call -> the query's end): what the user waits for.
   With ``--json-pack`` part 2 also reads ``rowFormat=arrow`` the way before ``connectors/mysql/packed_changes.py``
   (a JSON text per change, parsed back by the reader's ``Packer``) beside the source's typed packs.
2. **Change stream**: before the backlog, one query per (round, rowFormat) is started with ``startup=changes``
   (``availableNow``: it records the log's end in its checkpoint and ends); ``FLUSH BINARY LOGS``; then
   ``--changes`` inserts (``--txn``-row transactions of single-row INSERTs: one row event a change, as an OLTP
   writer; the same rows as part 1) are written while no query reads. Per round, side by side:
   ``mariadb-binlog --read-from-remote-server`` of that log file to /dev/null (the server's own client: the
   server's limit), then each query started again (``availableNow``, ``maxRowsPerTrigger`` unset) into ``noop``
   until it ends: changes/s = changes / (``start()`` -> end), and over the busy epochs alone (first epoch start
   -> last epoch end, Spark's progress). With ``--change-readers 1,2`` each query once per ``changeReaders``
   value (the epoch's range read by that many tasks at once). With ``--counted-planning`` also ``rowFormat=arrow`` with
   ``maxRowsPerTrigger`` set very high: the range planned by counting its rows (``row_count``), as every planning did
   before ``connectors/mysql/range_scan.py`` (which plans a range without a limit by its events' headers).
3. **Lag at a fixed rate** (the method of ``mirror_scaleout.py``'s paced rounds): ``flinkish mirror --from
   mysql://... --tables bench.lag --to <dir>/{schema}/{table} --trigger 1s`` (Delta; a process of its own, after
   the Spark session of parts 1-2 is stopped) snapshots ``bench.lag`` (``--lag-rows`` rows); then a writer
   commits ``--rate`` changes/s for ``--seconds`` s (``--per-txn``-row ``INSERT ... ON DUPLICATE KEY UPDATE`` of
   random existing keys: updates, each setting ``v`` to the writer's clock in microseconds just before its
   commit). Lag per change = the mtime of the first Delta log version whose added files hold the row - ``v``.

Each figure carries the load average (1 min) at its start and end, and CPU seconds: the client side (this process
and all its descendants but the server: the JVM, its Python workers, ``mariadb-binlog``, the mirror process) and
the server's own. The machine may be shared: compare ratios within a run, and the CPU columns.

    PYTHONPATH=. python benchmarks/mysql_source.py [--rows 1000000] [--changes 500000] [--repeats 3] [--delta]
        [--parts snapshot,changes,lag] [--rate 1000 --seconds 60] [--profile-changes] [--direct-pack]
        [--change-readers 1,2]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, write_results  # noqa: E402

from flinkish_spark.embedded.mariadb import EmbeddedMariaDB, find_program, temporary_mariadb  # noqa: E402

JAR = "/usr/share/java/mariadb-java-client.jar"
DDL = ("CREATE TABLE bench.t (id bigint PRIMARY KEY, n int, name varchar(64), amount decimal(12,2), "
       "ts datetime(6), score double)")
FILL = ("INSERT INTO bench.t SELECT seq, seq % 1000, concat('customer ', hex(seq * 7919)), (seq % 100000) / 100, "
        "'2024-01-01 00:00:00' + INTERVAL seq SECOND + INTERVAL (seq * 37) % 1000000 MICROSECOND, seq * 0.25 "
        "FROM bench.seq_1_to_{rows}")
TICKS = os.sysconf("SC_CLK_TCK")


# ---- CPU and load -------------------------------------------------------------------------------------------------

def _proc_table() -> dict[int, tuple[int, str, float]]:
    """pid -> (ppid, name, CPU seconds of the process itself: utime + stime)."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        pid, name = head.split("(", 1)
        out[int(pid)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def tree_cpu(server_pid: int) -> tuple[dict[int, float], float]:
    """(per live process of this process's tree but the server's subtree: its own CPU s; the server's CPU s)."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    mine: dict[int, float] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid == server_pid or pid not in table:
            continue
        # Direct children this process waits for (mariadb-binlog): counted by RUSAGE_CHILDREN, not sampled.
        if not (table[pid][0] == os.getpid() and table[pid][1].startswith("mariadb-binlog")):
            mine[pid] = table[pid][2]
        todo.extend(children.get(pid, []))
    server = sum(table[p][2] for p in (server_pid,) if p in table)
    return mine, server


class CpuSampler(threading.Thread):
    """Client CPU over a window: every live process of this process's tree (the JVM, Spark's Python workers, the
    mirror process and its own) sampled every 0.2 s, each counted up to its last sample (a Python worker that
    exits between samples loses at most 0.2 s), plus the waited-for children (``RUSAGE_CHILDREN``)."""

    def __init__(self, server_pid: int) -> None:
        super().__init__(daemon=True)
        self.server_pid, self.stop_event = server_pid, threading.Event()
        self.first, self.server0 = tree_cpu(server_pid)
        self.last = dict(self.first)
        self.server = self.server0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.children0 = ru.ru_utime + ru.ru_stime

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            self.sample()

    def sample(self) -> None:
        now, self.server = tree_cpu(self.server_pid)
        self.last.update(now)

    def finish(self) -> tuple[float, float]:
        self.stop_event.set()
        self.join()
        self.sample()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = sum(v - self.first.get(pid, 0.0) for pid, v in self.last.items())
        return client + ru.ru_utime + ru.ru_stime - self.children0, self.server - self.server0


class Meter:
    """Wall seconds, client and server CPU seconds and the load average around one measured call."""

    def __init__(self, server: EmbeddedMariaDB) -> None:
        assert server.process is not None
        self.server_pid = server.process.pid

    def __call__(self, label: str, fn: Callable[[], Any]) -> dict[str, Any]:
        load0 = os.getloadavg()[0]
        sampler = CpuSampler(self.server_pid)
        sampler.start()
        t0 = time.perf_counter()
        extra = fn() or {}
        seconds = time.perf_counter() - t0
        client, server = sampler.finish()
        return {"reader": label, "seconds": round(seconds, 3), "client_cpu_s": round(client, 2),
                "server_cpu_s": round(server, 2), "load_start": round(load0, 2),
                "load_end": round(os.getloadavg()[0], 2), **extra}


# ---- Spark helpers ------------------------------------------------------------------------------------------------

def epoch_start(p: Any) -> float:
    return datetime.strptime(p.timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


def observed(p: Any) -> int:
    return int(((getattr(p, "observedMetrics", None) or {}).get("rows") or {"n": 0})["n"] or 0)


def source_df(spark: Any, url: str, meta: str, uid: str, fmt: str, startup: str, args: argparse.Namespace,
              readers: int | None = None, counted: bool = False) -> Any:
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("flinkish.mysql").option("uid", uid).option("checkpoint", meta)
              .option("url", url).option("tables", "bench.t").option("startup", startup).option("rowFormat", fmt)
              .option("splitSize", str(args.split_size)).option("snapshotPartitions", str(args.partitions)))
    if counted:  # the planning that counts the range's rows (row_count), as every planning did before range_scan
        reader = reader.option("maxRowsPerTrigger", str(10**9))
    df = (reader if readers is None else reader.option("changeReaders", str(readers))).load()
    # Data rows (snapshot reads and changes): in the arrow shape a row is a pack of _count of them.
    n = F.sum("_count") if fmt == "arrow" else F.count_if(F.col("_op").isin("r", "c", "u", "d"))
    return df.observe("rows", F.coalesce(n, F.lit(0)).cast("long").alias("n"))


def run_query(df: Any, cp: str, sink: str = "noop", sink_opts: dict[str, str] | None = None,
              available_now: bool = False) -> dict[str, Any]:
    """Start the query and wait until it ends by itself; rows seen and the busy epochs' span."""
    w = df.writeStream.format(sink).option("checkpointLocation", cp)
    for k, v in (sink_opts or {}).items():
        w = w.option(k, v)
    if available_now:
        w = w.trigger(availableNow=True)
    q = w.start()
    q.awaitTermination(1800)
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    if q.isActive:
        q.stop()
        raise RuntimeError("the query did not end within 30 minutes")
    busy = [p for p in q.recentProgress if observed(p)]
    rows = sum(observed(p) for p in q.recentProgress)
    span = (max(epoch_start(p) + p.durationMs["triggerExecution"] / 1000 for p in busy)
            - min(epoch_start(p) for p in busy)) if busy else 0.0
    # latestOffset: the planning (a MySQL change range is read whole there); addBatch: the epoch's tasks and commit
    return {"rows": rows, "epochs": len(busy), "busy_s": round(span, 3),
            "epoch_ms": [p.durationMs["triggerExecution"] for p in busy],
            "latest_offset_ms": [p.durationMs.get("latestOffset", 0) for p in busy],
            "add_batch_ms": [p.durationMs.get("addBatch", 0) for p in busy]}


# ---- part 1: snapshot ----------------------------------------------------------------------------------------------

def part_snapshot(spark: Any, server: EmbeddedMariaDB, meter: Meter, work: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    server.sql(FILL.format(rows=args.rows) + "; ANALYZE TABLE bench.t")
    url = server.url_for("bench")
    chunks = -(-args.rows // args.split_size)
    jdbc_url = f"jdbc:mysql://127.0.0.1:{server.port}/bench?permitMysqlScheme"
    props = {"user": "root", "password": "", "driver": "org.mariadb.jdbc.Driver"}

    def jdbc(sink: str, out: str = "") -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            df = spark.read.jdbc(jdbc_url, "t", column="id", lowerBound=1, upperBound=args.rows + 1,
                                 numPartitions=chunks, properties=props)
            if sink == "noop":
                df.write.format("noop").mode("overwrite").save()
            else:
                df.write.mode("overwrite").parquet(out)
            return {"rows": args.rows}
        return go

    def flinkish(fmt: str, tag: str, sink: str = "noop", direct: bool = False,
                 flag_env: str = "FLINKISH_BENCH_DIRECT_PACK") -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            base = os.path.join(work, "snap", tag)
            meta = os.path.join(base, "meta")
            df = source_df(spark, url, meta, "src", fmt, "snapshot", args)
            opts = ({"uid": "lake", "checkpoint": meta, "path": os.path.join(base, "lake", "{schema}", "{table}")}
                    if sink == "flinkish.delta" else {})
            flag = os.environ.get(flag_env, "")
            if direct:
                open(flag, "w").close()  # benchmarks/direct_pack/sitecustomize.py: the prototype read while it exists
            try:
                return run_query(df, os.path.join(base, "cp"), sink, opts)
            finally:
                if direct:
                    os.remove(flag)
        return go

    jdbc("noop")()  # warm-up: the JVM's classes and JIT are not the reader's cost
    flinkish("arrow", "warmup")()  # and the Python workers' first imports
    results = []
    for r in range(args.repeats):
        cases = [(f"flinkish.mysql arrow -> noop", flinkish("arrow", f"a{r}")),
                 *([(f"flinkish.mysql json -> noop", flinkish("json", f"j{r}"))] if "json" in args.row_formats else []),
                 ("Spark JDBC -> noop", jdbc("noop"))]
        if args.row_loop:
            cases.insert(1, ("flinkish.mysql arrow, row loop (before row_packets) -> noop",
                             flinkish("arrow", f"l{r}", direct=True, flag_env="FLINKISH_BENCH_ROW_LOOP")))
        if args.direct_pack:
            cases.insert(1, ("flinkish.mysql arrow, direct pack (prototype) -> noop",
                             flinkish("arrow", f"p{r}", direct=True)))
        if args.json_pack:
            cases.insert(1, ("flinkish.mysql arrow, JSON way (before packed_chunks) -> noop",
                             flinkish("arrow", f"o{r}", direct=True, flag_env="FLINKISH_BENCH_JSON_PACK")))
        if args.delta:
            cases += [("flinkish.mysql arrow -> routed flinkish.delta", flinkish("arrow", f"d{r}", "flinkish.delta")),
                      ("Spark JDBC -> Parquet", jdbc("parquet", os.path.join(work, "snap", f"pq{r}")))]
            if args.json_pack:
                cases.insert(-1, ("flinkish.mysql arrow, JSON way (before packed_chunks) -> routed flinkish.delta",
                                  flinkish("arrow", f"e{r}", "flinkish.delta", direct=True,
                                           flag_env="FLINKISH_BENCH_JSON_PACK")))
            if args.direct_pack:
                cases.insert(-1, ("flinkish.mysql arrow, direct pack (prototype) -> routed flinkish.delta",
                                  flinkish("arrow", f"q{r}", "flinkish.delta", direct=True)))
        if r % 2:
            cases.reverse()  # alternate the order: neither side always runs first on a machine whose load drifts
        for label, fn in cases:
            res = meter(label, fn)
            assert res["rows"] == args.rows, (label, res["rows"], args.rows)
            res.update(round=r, rows_per_s=round(args.rows / res["seconds"]),
                       client_cpu_us_per_row=round(res["client_cpu_s"] * 1e6 / args.rows, 2))
            print(f"  snapshot r{r} {label}: {res['seconds']:.2f} s, {res['rows_per_s']:,} rows/s, "
                  f"cpu {res['client_cpu_s']} s, load {res['load_start']}-{res['load_end']}", flush=True)
            results.append(res)
        if args.delta and args.direct_pack and r == 0:  # the prototype's target: the same table as today's path's
            today, proto = (delta_rows(os.path.join(work, "snap", t, "lake", "bench", "t")) for t in ("d0", "q0"))
            assert today.num_rows == args.rows and today.equals(proto), "the direct pack wrote another table"
            print("  direct pack (prototype): its Delta target equals today's path's", flush=True)
        if args.delta and args.json_pack and r == 0:  # packed_chunks against the JSON way: the same table
            now, before = (delta_rows(os.path.join(work, "snap", t, "lake", "bench", "t")) for t in ("d0", "e0"))
            assert now.num_rows == args.rows and now.equals(before), "packed_chunks wrote another table"
            print("  packed_chunks: its Delta target equals the JSON way's", flush=True)
    return results


def delta_rows(path: str) -> Any:
    """A Delta target's rows, sorted by ``id`` (deltalake's scan: it applies deletion vectors)."""
    import deltalake
    import pyarrow as pa

    t = pa.table(deltalake.DeltaTable(path).scan())
    # delta-rs reads strings as string_view, which has no sort kernel: as plain strings
    t = t.cast(pa.schema([pa.field(f.name, pa.string() if pa.types.is_string_view(f.type) else f.type)
                          for f in t.schema]))
    return t.sort_by("id")


# ---- part 2: change stream -----------------------------------------------------------------------------------------

def value_row(i: int) -> str:
    ts = f"2024-01-01 00:00:00.{(i * 37) % 1_000_000:06d}"
    return (f"({i},{i % 1000},'customer {i:08x}{(i * 7919) % 1_000_003:06x}',{(i % 100_000) / 100:.2f},"
            f"'{ts}' + INTERVAL {i * 3 // 2} SECOND,{i * 0.25})")


def write_backlog(server: EmbeddedMariaDB, first: int, changes: int, txn: int) -> float:
    parts = []
    for start in range(first, first + changes, txn):
        parts.append("BEGIN;")
        parts.extend(f"INSERT INTO bench.t VALUES {value_row(i)};" for i in range(start, min(start + txn, first + changes)))
        parts.append("COMMIT;")
    t0 = time.monotonic()
    out = subprocess.run([str(find_program("mariadb")), "--no-defaults", "-uroot", f"--socket={server.socket_path}"],
                         input="\n".join(parts), text=True, capture_output=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return time.monotonic() - t0


def part_changes(spark: Any, server: EmbeddedMariaDB, meter: Meter, work: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    url = server.url_for("bench")
    # "arrow+direct": rowFormat=arrow read with benchmarks/direct_pack's change prototype (its flag file present);
    # "arrow+json": rowFormat=arrow the way before packed_changes (a JSON text per change, the Packer parses it back)
    formats = ([f for f in args.row_formats.split(",") if f] + (["arrow+direct"] if args.direct_pack else [])
               + (["arrow+json"] if args.json_pack else []) + (["arrow+counted"] if args.counted_planning else []))
    # "<fmt>@<n>": read with changeReaders=n (the range in n tasks); --change-readers unset: the source's default
    if args.change_readers:
        formats = [f"{f}@{n}" for f in formats for n in args.change_readers.split(",")]
    queries = [(r, fmt) for r in range(args.repeats) for fmt in formats]
    for r, fmt in queries:  # each records the log's end now, before the backlog
        base = os.path.join(work, "chg", f"{fmt}{r}")
        run_query(source_df(spark, url, os.path.join(base, "meta"), "src", _shape(fmt), "changes", args),
                  os.path.join(base, "cp"), available_now=True)
    server.sql("FLUSH BINARY LOGS")
    log_file = server.sql("SHOW MASTER STATUS").split("\t")[0]
    first = args.rows + 1 if "snapshot" in args.parts else 1
    write_s = write_backlog(server, first, args.changes, args.txn)
    log_bytes = int(next(line.split("\t")[1] for line in server.sql("SHOW BINARY LOGS").splitlines()
                         if line.startswith(log_file)))
    server.sql("FLUSH BINARY LOGS")  # the backlog's file ends: mariadb-binlog reads exactly it
    print(f"  backlog: {args.changes:,} inserts in {args.txn}-row transactions, {write_s:.1f} s, "
          f"{log_file} {log_bytes / 2**20:.1f} MiB", flush=True)

    def mariadb_binlog() -> dict[str, Any]:
        cmd = [str(find_program("mariadb-binlog")), "--no-defaults", "--read-from-remote-server", "-h127.0.0.1",
               f"-P{server.port}", "-uroot", log_file]
        with open(os.devnull, "w") as null:
            subprocess.run(cmd, stdout=null, check=True)
        return {"rows": args.changes}

    def flinkish(r: int, fmt: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            base = os.path.join(work, "chg", f"{fmt}{r}")
            switched = fmt.split("@")[0].endswith(("+direct", "+json"))
            flag = os.environ.get("FLINKISH_BENCH_DIRECT_PACK" if fmt.split("@")[0].endswith("+direct")
                                  else "FLINKISH_BENCH_JSON_PACK", "")
            if switched:
                open(flag, "w").close()
            try:
                return run_query(source_df(spark, url, os.path.join(base, "meta"), "src", _shape(fmt), "changes",
                                           args, _readers(fmt), "+counted" in fmt), os.path.join(base, "cp"),
                                 available_now=True)
            finally:
                if switched:
                    os.remove(flag)
        return go

    results = []
    for r in range(args.repeats):
        cases = [("mariadb-binlog --read-from-remote-server > /dev/null", mariadb_binlog)]
        named = {"+direct": ", typed changes (prototype)", "+json": ", JSON way (before packed_changes)",
                 "+counted": ", rows counted at planning (before range_scan)"}
        cases += [(f"flinkish.mysql {_shape(fmt)}{named.get(fmt.split('@')[0][len(_shape(fmt)):], '')}"
                   f"{'' if _readers(fmt) is None else f', changeReaders={_readers(fmt)}'} -> noop",
                   flinkish(r, fmt)) for fmt in formats]
        if r % 2:
            cases.reverse()
        for label, fn in cases:
            if args.profile_changes and label.startswith("flinkish") and r == 0:
                fn = profiled(fn, os.path.join(work, f"pyspy-{label.split()[1]}.txt"))
            res = meter(label, fn)
            assert res["rows"] == args.changes, (label, res["rows"], args.changes)
            res.update(round=r, changes_per_s=round(args.changes / res["seconds"]),
                       client_cpu_us_per_change=round(res["client_cpu_s"] * 1e6 / args.changes, 2))
            if res.get("busy_s"):
                res["changes_per_s_busy"] = round(args.changes / res["busy_s"])
            print(f"  changes r{r} {label}: {res['seconds']:.2f} s, {res['changes_per_s']:,}/s "
                  f"(busy epochs {res.get('changes_per_s_busy', '-')}/s; planning {res.get('latest_offset_ms')} ms, "
                  f"batch {res.get('add_batch_ms')} ms), cpu {res['client_cpu_s']} s, "
                  f"server cpu {res['server_cpu_s']} s, load {res['load_start']}-{res['load_end']}", flush=True)
            results.append(res)
    return results


def _shape(fmt: str) -> str:
    """The rowFormat of a case name of part 2 (``arrow+json@2``: arrow)."""
    return fmt.split("@")[0].split("+")[0]


def _readers(fmt: str) -> int | None:
    """The changeReaders of a case name of part 2 (None: the source's default)."""
    return int(fmt.split("@")[1]) if "@" in fmt else None


def profiled(fn: Callable[[], dict[str, Any]], out: str) -> Callable[[], dict[str, Any]]:
    """py-spy (from the venv, when there) sampling this process's tree while ``fn`` runs: where a change's time goes."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")

    def go() -> dict[str, Any]:
        if not os.path.exists(spy):
            return fn()
        proc = subprocess.Popen([spy, "record", "--subprocesses", "--nonblocking", "-r", "50", "-f", "raw",
                                 "-o", out, "--pid", str(os.getpid())], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            return fn()
        finally:
            proc.send_signal(2)
            proc.wait(timeout=60)
            print(f"  py-spy profile: {out}", flush=True)
    return go


# ---- part 3: the mirror's lag --------------------------------------------------------------------------------------

_VERSIONS: dict[str, tuple[float, list[int]]] = {}  # a log file -> its mtime and the v values its adds hold


def versions_visible(table_dir: str) -> dict[int, float]:
    """v -> the mtime of the first Delta version whose added files hold it (log files read once, cached)."""
    import pyarrow.parquet as pq

    seen: dict[int, float] = {}
    for log_file in sorted(glob.glob(os.path.join(table_dir, "_delta_log", "*.json"))):
        if log_file not in _VERSIONS:
            values: list[int] = []
            for line in open(log_file).read().splitlines():
                add = json.loads(line).get("add")
                if add and add.get("dataChange"):
                    col = pq.read_table(os.path.join(table_dir, add["path"]), columns=["v"]).column("v")
                    values.extend(v for v in col.to_pylist() if v)
            _VERSIONS[log_file] = (os.path.getmtime(log_file), values)
        mtime, values = _VERSIONS[log_file]
        for v in values:
            if seen.get(v, mtime + 1) > mtime:
                seen[v] = mtime
    return seen


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def part_lag(server: EmbeddedMariaDB, meter: Meter, work: str, args: argparse.Namespace) -> dict[str, Any]:
    import pymysql

    from flinkish_spark.testing.mirror_process import flinkish

    server.sql("CREATE TABLE bench.lag (id int PRIMARY KEY, v bigint, note varchar(32)); "
               f"INSERT INTO bench.lag SELECT seq, 0, concat('row ', seq) FROM bench.seq_1_to_{args.lag_rows}")
    base = os.path.join(work, "lag")
    lake, meta, log = os.path.join(base, "lake"), os.path.join(base, "meta"), os.path.join(base, "mirror.log")
    os.makedirs(base)
    cmd = [*flinkish(), "mirror", "--from", f"mysql://root@127.0.0.1:{server.port}/", "--tables", "bench.lag",
           "--to", os.path.join(lake, "{schema}", "{table}"), "--checkpoint", meta, "--trigger", args.trigger]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    table_dir = os.path.join(lake, "bench", "lag")
    try:
        deadline = time.time() + 600
        while not glob.glob(os.path.join(table_dir, "_delta_log", "*.json")):
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the mirror ended or stalled before its snapshot: {open(log).read()[-3000:]}")
            time.sleep(0.5)
        time.sleep(10)  # the snapshot's epochs committed, the change epochs running
        stats: dict[str, Any] = {}

        def writer() -> dict[str, Any]:
            conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", password="", autocommit=True)
            rnd, done, t0 = random.Random(29), 0, time.time()
            behind_max = 0.0
            with conn.cursor() as cur:
                while (now := time.time()) - t0 < args.seconds:
                    ids = rnd.sample(range(1, args.lag_rows + 1), args.per_txn)
                    v = time.time_ns() // 1000
                    cur.execute("INSERT INTO bench.lag (id, v) VALUES " + ",".join(f"({i},{v + k})" for k, i in enumerate(ids))
                                + " ON DUPLICATE KEY UPDATE v = VALUES(v)")
                    done += args.per_txn
                    stats["last_v"] = v + args.per_txn - 1
                    ahead = done / args.rate - (time.time() - t0)
                    behind_max = max(behind_max, -ahead)
                    if ahead > 0.001:
                        time.sleep(ahead)
            conn.close()
            stats.update(changes=done, t0=t0, t1=time.time(), writer_behind_max_s=round(behind_max, 3))
            return {}

        res = meter("writer", writer)
        t0, t1 = stats["t0"], stats["t1"]
        deadline = time.time() + 300
        expected = stats["changes"]
        while True:  # caught up: the writer's last change visible (it is its key's last: never folded away)
            seen = {v: m for v, m in versions_visible(table_dir).items() if t0 * 1e6 <= v <= t1 * 1e6 + 1e6}
            if stats["last_v"] in seen or time.time() > deadline or proc.poll() is not None:
                break
            time.sleep(1)
        caught_up = time.time()
    finally:
        proc.send_signal(15)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
    lags = sorted((m - v / 1e6, v / 1e6) for v, m in seen.items())
    first = [lag for lag, at in sorted(lags, key=lambda x: x[1]) if at < t0 + 30]
    last = [lag for lag, at in sorted(lags, key=lambda x: x[1]) if at >= t1 - 30]
    versions = len(glob.glob(os.path.join(table_dir, "_delta_log", "*.json")))
    out = {**res, "reader": "flinkish mirror (Delta, trigger " + args.trigger + ")", "rate_asked": args.rate,
           "rate_reached": round(expected / (t1 - t0)), "changes": expected,
           # Changes of one key in one epoch are folded into its last row (a keyed target): those never show.
           "seen": len(seen), "folded_away": expected - len(seen),
           "seconds": round(t1 - t0, 1), "caught_up_after_s": round(caught_up - t1, 1), "delta_versions": versions,
           "writer_behind_max_s": stats["writer_behind_max_s"],
           "lag_ms_p50": round(1000 * percentile([x for x, _ in lags], 0.5)),
           "lag_ms_p99": round(1000 * percentile([x for x, _ in lags], 0.99)),
           "lag_ms_max": round(1000 * max(x for x, _ in lags)) if lags else None,
           "lag_ms_p50_first_30s": round(1000 * percentile(first, 0.5)),
           "lag_ms_p50_last_30s": round(1000 * percentile(last, 0.5)),
           "mirror_log_tail": open(log).read()[-1500:]}
    print(f"  lag: {out['rate_reached']}/s for {out['seconds']} s, {len(seen)}/{expected} seen, p50 "
          f"{out['lag_ms_p50']} ms, p99 {out['lag_ms_p99']} ms, load {out['load_start']}-{out['load_end']}", flush=True)
    return out


# ---- main -----------------------------------------------------------------------------------------------------------

def summarize(runs: list[dict[str, Any]], key: str, ref: str) -> list[dict[str, Any]]:
    labels = list(dict.fromkeys(r["reader"] for r in runs))
    med = {lb: statistics.median(r[key] for r in runs if r["reader"] == lb) for lb in labels}
    cpu = {lb: statistics.median(r["client_cpu_s"] for r in runs if r["reader"] == lb) for lb in labels}
    out = []
    for lb in labels:
        mine = [r for r in runs if r["reader"] == lb]
        out.append({"reader": lb, f"median_{key}": round(med[lb]), "ratio": round(med[lb] / med[ref], 2),
                    "median_client_cpu_s": round(cpu[lb], 2), "cpu_ratio": round(cpu[lb] / cpu[ref], 2),
                    "median_server_cpu_s": round(statistics.median(r["server_cpu_s"] for r in mine), 2),
                    "seconds": [r["seconds"] for r in mine],
                    "load": f"{min(r['load_start'] for r in mine):.1f}-{max(r['load_end'] for r in mine):.1f}"})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="snapshot,changes,lag")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--split-size", type=int, default=100_000)
    ap.add_argument("--partitions", type=int, default=2, help="snapshotPartitions")
    ap.add_argument("--changes", type=int, default=500_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--row-formats", default="arrow,json")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--delta", action="store_true", help="part 1 also into routed flinkish.delta (vs JDBC -> Parquet)")
    ap.add_argument("--direct-pack", action="store_true",
                    help="part 1 also with the prototype of benchmarks/direct_pack/ (typed Arrow packed, no JSON)")
    ap.add_argument("--json-pack", action="store_true",
                    help="parts 1 and 2 also with rowFormat=arrow the way before packed_chunks/packed_changes "
                         "(JSON per row, Packer)")
    ap.add_argument("--change-readers", default="",
                    help="part 2 once per changeReaders value, e.g. 1,2 (default: the source's default only)")
    ap.add_argument("--row-loop", action="store_true",
                    help="part 1 also with the row loop of snapshot.read_chunk before connectors/mysql/row_packets.py "
                         "(benchmarks/direct_pack/sitecustomize.py switches it on in the Python workers)")
    ap.add_argument("--counted-planning", action="store_true",
                    help="part 2 also with the planning that counts rows (maxRowsPerTrigger set very high: the "
                         "planning before connectors/mysql/range_scan.py)")
    ap.add_argument("--profile-changes", action="store_true", help="py-spy of round 0's flinkish change reads")
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--per-txn", type=int, default=10)
    ap.add_argument("--lag-rows", type=int, default=100_000)
    ap.add_argument("--trigger", default="1s")
    ap.add_argument("--name", default="mysql_source")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = tempfile.mkdtemp(prefix="flinkish-bench-mysql-source-")
    if args.json_pack:
        os.environ["FLINKISH_BENCH_JSON_PACK"] = os.path.join(work, "json-pack.flag")
    if args.row_loop:
        os.environ["FLINKISH_BENCH_ROW_LOOP"] = os.path.join(work, "row-loop.flag")
    if args.direct_pack or args.json_pack or args.row_loop:  # before the JVM starts: Spark's Python workers inherit the environment
        if args.direct_pack:
            os.environ["FLINKISH_BENCH_DIRECT_PACK"] = os.path.join(work, "direct-pack.flag")
        os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                 "direct_pack"), os.environ.get("PYTHONPATH", "")])
    payload: dict[str, Any] = {"args": vars(args), "load_at_start": os.getloadavg()}
    try:
        with temporary_mariadb("flinkish-bench-mariadb-") as server:
            server.sql("CREATE DATABASE bench; " + DDL)
            meter = Meter(server)
            if {"snapshot", "changes"} & set(args.parts.split(",")):
                import flinkish_spark

                spark = flinkish_spark.session(app_name="bench-mysql-source", conf={
                    "spark.jars": JAR, "spark.ui.enabled": "false", "spark.driver.memory": "2g",
                    "spark.sql.streaming.numRecentProgressUpdates": "10000"})
                spark.sparkContext.setLogLevel("ERROR")
                if "snapshot" in args.parts:
                    runs = part_snapshot(spark, server, meter, work, args)
                    payload["snapshot"] = {"runs": runs, "summary": summarize(runs, "rows_per_s", "Spark JDBC -> noop")}
                if "changes" in args.parts:
                    runs = part_changes(spark, server, meter, work, args)
                    ref = "mariadb-binlog --read-from-remote-server > /dev/null"
                    payload["changes"] = {"runs": runs, "summary": summarize(runs, "changes_per_s", ref)}
                spark.stop()
            if "lag" in args.parts:
                payload["lag"] = part_lag(server, meter, work, args)
    finally:
        if os.environ.get("KEEP_WORK"):
            print("work folder kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    for part, key in (("snapshot", "rows_per_s"), ("changes", "changes_per_s")):
        if part in payload:
            print(f"\n{part}:")
            print_table(["reader", "median /s", "ratio", "client CPU s", "CPU ratio", "server CPU s", "seconds", "load"],
                        [[s["reader"], s[f"median_{key}"], s["ratio"], s["median_client_cpu_s"], s["cpu_ratio"],
                          s["median_server_cpu_s"], " ".join(str(x) for x in s["seconds"]), s["load"]]
                         for s in payload[part]["summary"]])
    if "lag" in payload:
        lag = payload["lag"]
        print(f"\nlag: {lag['rate_reached']} changes/s for {lag['seconds']} s: p50 {lag['lag_ms_p50']} ms, p99 "
              f"{lag['lag_ms_p99']} ms, max {lag['lag_ms_max']} ms; load {lag['load_start']}-{lag['load_end']}")
    payload["load_at_end"] = os.getloadavg()
    print("wrote", write_results(args.name, payload))


if __name__ == "__main__":
    main()
