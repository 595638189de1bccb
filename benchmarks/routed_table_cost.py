"""The per-changed-table cost of the routed Delta sink without Spark: one task's prepare and the driver's commit.

Issue 26: an epoch of a many-table mirror costs per changed table -- the sink task's prepare
(split, decode, keyed prepare, Parquet files) and the driver's commit (one Delta version each).
Here ``RoutedDeltaSink`` alone (no Spark, no database): N tables ``(id int, v bigint, s text)``
get a snapshot epoch, then ``--epochs`` epochs that change every table (``--changes`` updates
each, hand-made stream rows). Per epoch: the prepare of all tables in one call (one task), the
commit (8 threads after the first table, as in the sink), each divided by N. With ``--profile prepare|commit``
the cProfile of the last epoch's prepare or commit, top functions by own time, and grouped by module.

    python benchmarks/routed_table_cost.py [--tables 300] [--epochs 3] [--changes 3] [--profile prepare|commit]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--changes", type=int, default=3, help="updates per table per epoch")
    ap.add_argument("--profile", choices=("prepare", "commit"), default=None, help="cProfile the last epoch's ...")
    ap.add_argument("--name", default="routed_table_cost")
    args = ap.parse_args()

    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext
    from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

    tmp = tempfile.mkdtemp(prefix="flinkish-bench-routed-cost-")
    try:
        meta = os.path.join(tmp, "meta")
        log = DecisionLog(FileIO.for_url(meta), meta, "m")
        route = Route(os.path.join(tmp, "lake", "{schema}", "{table}"), "path")
        sink = RoutedDeltaSink(FileIO.for_url(tmp), route, "m", metadata_io=FileIO.for_url(meta),
                               metadata_dir=log.directory)
        schemas = [table_schema(f"bench.t_{i:05d}", [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",))
                   for i in range(args.tables)]
        s = StreamBuilder()
        for schema in schemas:
            s.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, 21)])
        commit_epoch(sink, log, 0, [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 0, 0, 0))], "run")
        out: list[dict[str, Any]] = []
        for epoch in range(1, args.epochs + 1):
            for j in range(args.changes):
                s.transaction(*[(schema, "u", {"id": 1 + (epoch * 7 + j) % 20, "v": epoch, "s": "y"})
                                for schema in schemas])
            rows = s.batch()
            prof = cProfile.Profile() if args.profile and epoch == args.epochs else None
            t0 = time.perf_counter()
            if prof and args.profile == "prepare":
                prof.enable()
            c = sink.prepare(iter(rows.to_batches()), PrepareContext("m", epoch, 0, 0))
            if prof:
                prof.disable()
            t1 = time.perf_counter()
            if prof and args.profile == "commit":
                prof.enable()
            commit_epoch(sink, log, epoch, [c], "run")
            if prof:
                prof.disable()
            t2 = time.perf_counter()
            r = {"epoch": epoch, "rows": rows.num_rows, "prepare_s": round(t1 - t0, 3), "commit_s": round(t2 - t1, 3),
                 "prepare_ms_per_table": round(1000 * (t1 - t0) / args.tables, 2),
                 "commit_ms_per_table": round(1000 * (t2 - t1) / args.tables, 2), "load": os.getloadavg()[0]}
            print(r, flush=True)
            out.append(r)
            if prof:
                text = io.StringIO()
                stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
                stats.print_stats(25)
                print(text.getvalue())
                by_module: dict[str, float] = {}
                for (file, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
                    key = file.split("site-packages/")[-1].split("flinkish_spark/")[-1]
                    by_module[key] = by_module.get(key, 0.0) + tottime
                print("own time by file, ms per table:")
                for key, t in sorted(by_module.items(), key=lambda kv: -kv[1])[:20]:
                    print(f"  {1000 * t / args.tables:7.2f}  {key}")
        print("\nwrote", write_results(args.name, {"args": vars(args), "epochs": out}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
