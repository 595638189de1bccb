"""The CPU of a ``flinkish.mysql`` change task per change, without Spark (issue 29: the change stream at >= 0.5x of
``mariadb-binlog``): what one task of an epoch does with its range, in a process of its own.

On a MariaDB 10.11 of :mod:`flinkish_spark.embedded.mariadb`, ``bench.t`` of ``benchmarks/mysql_source.py`` gets
``--changes`` single-row INSERTs in ``--txn``-row transactions (its change part's backlog: one row event a change) in
a log file of their own. Then per round, each in a child process (so that two versions of the code can be compared
on the same log, alternating: ``--before DIR``, a tree holding an older ``flinkish_spark/``):

* ``task``: ``MysqlDialect.read_changes`` of the whole range with ``packed_chunks`` (``rowFormat=arrow``) through
  the reader's ``Packer().pack_all`` -- what ``TablesReaderCore.read`` gives Spark: the replication connection, the
  events, the row decoding, the typed packs (Arrow IPC per pack);
* ``plan``: ``range_scan.scan_range`` of the same range (the driver's planning of a range without a limit).

Printed per stage: CPU seconds (``time.process_time`` of the child, the reading alone), wall seconds and CPU us per
change; with ``--digest`` also a digest of the task's rows (every packed row's fields and every pack's values), to
check that two versions give the same stream. The machine may be shared: compare the CPU figures, alternated.

    PYTHONPATH=. nice -n 19 python benchmarks/mysql_decode.py [--changes 200000] [--repeats 3] [--before DIR]
        [--digest] [--profile N]
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def child(args: argparse.Namespace) -> None:
    """One round in this process: the stages on ``[args.start, args.end)``, a JSON line of figures on stdout."""
    from flinkish_spark.connectors.cdc.patterns import TablePatterns
    from flinkish_spark.connectors.mysql.connection import parse_url
    from flinkish_spark.connectors.mysql.dialect import MysqlDialect
    from flinkish_spark.connectors.mysql.range_scan import scan_range
    from flinkish_spark.connectors.postgres.rows.packed import Packer

    info = parse_url(args.url)
    patterns = TablePatterns.parse("bench.t", "tables")
    dialect = MysqlDialect(info, patterns=patterns)
    dialect.packed_chunks = True
    # the imports and first connection of a task's worker, untimed: a warm-up range of one transaction before
    list(Packer().pack_all(dialect.read_changes(args.warm, args.start, None)))
    start, end = dialect._position(args.start), dialect._position(args.end)
    out: dict[str, Any] = {}

    def task() -> tuple[int, list[Any]]:
        batches = list(Packer().pack_all(dialect.read_changes(args.start, args.end, None)))
        return sum(int(x or 0) for b in batches for x in b.column("_count").to_pylist()), batches

    def plan() -> tuple[int, list[Any]]:
        return sum(t.events for t in scan_range(info, start, end, 4713, patterns.matches)), []

    for stage, fn in (("task", task), ("plan", plan)):
        if args.stages and stage not in args.stages.split(","):
            continue
        profiler = cProfile.Profile() if args.profile and stage == "task" else None
        c0, t0 = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        n, batches = fn()
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        out[stage] = {"changes": n, "cpu_s": round(cpu, 3), "seconds": round(wall, 3),
                      "cpu_us_per_change": round(cpu * 1e6 / max(n, 1), 2)}
        if args.digest and batches:
            out[stage]["digest"] = digest(batches)
        if profiler is not None:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.profile)
            out[stage]["profile"] = text.getvalue()
    print(json.dumps(out), flush=True)


def digest(batches: list[Any]) -> str:
    """The task's rows, as a user of the stream sees them: each packed row's fields, each pack's values."""
    from flinkish_spark.connectors.postgres.rows.packed import read_pack

    h = hashlib.sha256()
    for b in batches:
        blobs = b.column("batch")
        for i, row in enumerate(b.drop_columns(["batch"]).to_pylist()):
            h.update(repr(sorted(row.items())).encode())
            blob = blobs[i].as_py()
            if row["_op"] == "p":
                t = read_pack(blob)
                h.update(repr(t.schema).encode())
                for name in t.column_names:
                    h.update(repr(t.column(name).to_pylist()).encode())
            else:
                h.update(blob)
    return h.hexdigest()[:16]


def run_child(code: str, url: str, bounds: tuple[int, int, int], args: argparse.Namespace,
              digest_it: bool) -> dict[str, Any]:
    warm, start, end = bounds
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--url", url, "--warm", str(warm),
           "--start", str(start), "--end", str(end)]
    if digest_it:
        cmd.append("--digest")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    if args.stages:
        cmd += ["--stages", args.stages]
    env = dict(os.environ, PYTHONPATH=code)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-4000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--txn", type=int, default=1000, help="rows per transaction of the backlog")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--before", default="", help="a tree holding the flinkish_spark/ to compare with (alternated)")
    ap.add_argument("--digest", action="store_true", help="a digest of the task's rows in the first round")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the task stage, print its top N functions")
    ap.add_argument("--stages", default="", help="task,plan (default: both)")
    ap.add_argument("--name", default="", help="write benchmarks/results/<name>.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--warm", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    from mysql_source import DDL, write_backlog

    from flinkish_spark.connectors.mysql.changes import position_key
    from flinkish_spark.connectors.mysql.position import FilePosition
    from flinkish_spark.embedded.mariadb import temporary_mariadb

    after = os.path.dirname(HERE)
    codes = [("after", after)] + ([("before", os.path.abspath(args.before))] if args.before else [])
    runs: list[dict[str, Any]] = []
    with temporary_mariadb("flinkish-bench-mariadb-") as server:
        server.sql("CREATE DATABASE bench; " + DDL + "; FLUSH BINARY LOGS")
        warm = position_key(FilePosition(server.sql("SHOW MASTER STATUS").split("\t")[0], 4))
        write_backlog(server, -1, 1, 1)  # the warm-up transaction (one row, id -1)

        def here() -> int:
            file, offset = server.sql("SHOW MASTER STATUS").split("\t")[:2]
            return position_key(FilePosition(file, int(offset)))

        start = here()
        write_s = write_backlog(server, 1, args.changes, args.txn)
        end = here()
        print(f"backlog: {args.changes:,} inserts in {args.txn}-row transactions, {write_s:.1f} s", flush=True)
        for r in range(args.repeats):
            order = codes if r % 2 == 0 else codes[::-1]
            for label, code in order:
                load = os.getloadavg()[0]
                res = run_child(code, server.url_for("bench"), (warm, start, end), args, args.digest and r == 0)
                for stage, fig in res.items():
                    profile = fig.pop("profile", None)
                    assert fig["changes"] == args.changes, (label, stage, fig)
                    runs.append({"code": label, "stage": stage, "round": r, "load": round(load, 2), **fig})
                    print(f"  r{r} {label:6s} {stage}: cpu {fig['cpu_s']:.2f} s = {fig['cpu_us_per_change']:.2f} "
                          f"us/change, wall {fig['seconds']:.2f} s, load {load:.1f}"
                          + (f", digest {fig['digest']}" if "digest" in fig else ""), flush=True)
                    if profile:
                        print(profile)
    print("\nmedians (CPU us per change):")
    for label, _ in codes:
        for stage in ("task", "plan"):
            xs = [x["cpu_us_per_change"] for x in runs if x["code"] == label and x["stage"] == stage]
            if xs:
                print(f"  {label:6s} {stage}: {statistics.median(xs):.2f} us/change  (rounds: {xs})")
    if args.name:
        from _common import write_results

        print("wrote", write_results(args.name, {"args": vars(args), "runs": runs}))


if __name__ == "__main__":
    main()
