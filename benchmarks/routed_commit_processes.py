"""The routed Delta sink's commit with ``commitProcesses`` = 0 (the commit worker's 8 threads), 1, 2 (no Spark).

Issue 26: at 1,000 tables the per-epoch commit (one Delta version per changed table) is most of the epoch. Here
N tables ``(id int, v bigint, s text)`` of 20 rows, every one changed in every epoch (``--changes`` updates each);
the sink's prepare runs in this process (not timed), then ``commit_epoch`` (decision, the tables' commits,
``.done``, cleanup) is timed -- with P committer processes the tables' commits run there (started at the snapshot
epoch, not timed either). Rounds alternate P (e.g. 0,1,2,0,1,2), fresh tables each, so the figures are side by
side under the same load.

    nice -n 19 python benchmarks/routed_commit_processes.py [--tables 1000] [--epochs 4] [--processes 0,1,2,0,1,2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402


def one_round(n: int, processes: int, args: argparse.Namespace) -> dict[str, Any]:
    from flinkish_spark.connectors.delta import committers
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext
    from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

    tmp = tempfile.mkdtemp(prefix="flinkish-bench-commit-processes-")
    uid = f"m{processes}-{time.monotonic_ns()}"  # a pool of its own per round
    try:
        meta = os.path.join(tmp, "meta")
        log = DecisionLog(FileIO.for_url(meta), meta, uid)
        sink = RoutedDeltaSink(FileIO.for_url(tmp), Route(os.path.join(tmp, "lake", "{schema}", "{table}"), "path"), uid,
                               metadata_io=FileIO.for_url(meta), metadata_dir=log.directory, commit_processes=processes)
        schemas = [table_schema(f"bench.t_{i:05d}", [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",))
                   for i in range(n)]
        s = StreamBuilder()
        epochs = []
        for epoch in range(args.epochs + 1):
            if epoch == 0:
                for schema in schemas:
                    s.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, 21)])
            else:
                for j in range(args.changes):
                    s.transaction(*[(schema, "u", {"id": 1 + (epoch * 7 + j) % 20, "v": epoch, "s": "y"})
                                    for schema in schemas])
            c = sink.prepare(iter(s.batch().to_batches()), PrepareContext(uid, epoch, 0, 0))
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            commit_epoch(sink, log, epoch, [c], "run")
            wall = time.perf_counter() - t0
            if epoch:  # epoch 0 creates the tables (and starts the committers)
                epochs.append({"epoch": epoch, "commit_s": round(wall, 3), "load": round(load, 2)})
        walls = sorted(e["commit_s"] for e in epochs)
        r = {"tables": n, "processes": processes, "commit_s_p50": walls[len(walls) // 2],
             "ms_per_table_wall": round(1000 * walls[len(walls) // 2] / n, 2),
             "load_avg": round(sum(e["load"] for e in epochs) / len(epochs), 2), "epochs": epochs}
        print({k: v for k, v in r.items() if k != "epochs"}, flush=True)
        return r
    finally:
        pool = committers._POOLS.pop(uid, None)
        if pool is not None:
            pool.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--changes", type=int, default=3, help="updates per table per epoch")
    ap.add_argument("--processes", default="0,1,2,0,1,2", help="commitProcesses per round, in order")
    ap.add_argument("--name", default="routed_commit_processes")
    args = ap.parse_args()
    rounds = [one_round(args.tables, int(p), args) for p in args.processes.split(",")]
    by: dict[int, list[float]] = {}
    for r in rounds:
        by.setdefault(r["processes"], []).append(r["ms_per_table_wall"])
    medians = {k: sorted(v)[len(v) // 2] for k, v in by.items()}
    print("ms per table (wall, median of rounds) by commitProcesses:", medians)
    print("\nwrote", write_results(args.name, {"args": vars(args), "ms_per_table": medians, "rounds": rounds}))


if __name__ == "__main__":
    main()
