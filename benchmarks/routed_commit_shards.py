"""How far the routed Delta sink's per-table work scales over processes on this machine (no Spark): 1 vs P shards.

Issue 26, target 3: the driver commits every changed table of an epoch in one Python process (8
threads, one GIL), so a second sink task halves the prepare but not the commit. What would a
commit spread over P processes give? Here N tables ``(id int, v bigint, s text)`` of 20 rows are
split by a hash of the name into P shards; each shard is one long-lived process (its caches warm
from epoch to epoch, as a stable table -> committer assignment would keep them) that runs, per
epoch, the prepare and the commit of its tables (its own ``RoutedDeltaSink`` and decision log:
a benchmark of the per-table work, not of a protocol). The parent starts every shard's epoch at
once and takes the epoch's wall time when the last shard is done. Rounds alternate ``--shards``
(e.g. 1,2,1,2), fresh tables each, so the ratio is measured side by side under the same load.

    python benchmarks/routed_commit_shards.py [--tables 1000] [--epochs 6] [--shards 1,2,1,2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
import zlib
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402


def shard_loop(tmp: str, names: list[str], epochs: int, changes: int, go: Any, done: Any) -> None:
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext
    from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

    meta = os.path.join(tmp, f"meta-{os.getpid()}")
    log = DecisionLog(FileIO.for_url(meta), meta, "m")
    sink = RoutedDeltaSink(FileIO.for_url(tmp), Route(os.path.join(tmp, "lake", "{schema}", "{table}"), "path"), "m",
                           metadata_io=FileIO.for_url(meta), metadata_dir=log.directory)
    schemas = [table_schema(n, [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",)) for n in names]
    s = StreamBuilder()
    for epoch in range(epochs + 1):
        if epoch == 0:
            for schema in schemas:
                s.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, 21)])
        else:
            for j in range(changes):
                s.transaction(*[(schema, "u", {"id": 1 + (epoch * 7 + j) % 20, "v": epoch, "s": "y"})
                                for schema in schemas])
        rows = s.batch()
        go.wait()
        t0 = time.perf_counter()
        c = sink.prepare(iter(rows.to_batches()), PrepareContext("m", epoch, 0, 0))
        t1 = time.perf_counter()
        commit_epoch(sink, log, epoch, [c], "run")
        done.put((os.getpid(), epoch, t1 - t0, time.perf_counter() - t1))


def one_round(n: int, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    tmp = tempfile.mkdtemp(prefix="flinkish-bench-commit-shards-")
    names = [f"bench.t_{i:05d}" for i in range(n)]
    parts = [[t for t in names if zlib.crc32(t.encode()) % shards == k] for k in range(shards)]
    go, done = ctx.Barrier(shards + 1), ctx.Queue()
    procs = [ctx.Process(target=shard_loop, args=(tmp, part, args.epochs, args.changes, go, done)) for part in parts]
    try:
        for p in procs:
            p.start()
        epochs = []
        for epoch in range(args.epochs + 1):
            load = os.getloadavg()[0]
            go.wait()
            t0 = time.perf_counter()
            got = [done.get(timeout=600) for _ in procs]
            wall = time.perf_counter() - t0
            if epoch:  # epoch 0 is the snapshot
                epochs.append({"epoch": epoch, "wall_s": round(wall, 3), "load": round(load, 2),
                               "prepare_s_sum": round(sum(g[2] for g in got), 3),
                               "commit_s_sum": round(sum(g[3] for g in got), 3)})
        for p in procs:
            p.join()
        walls = sorted(e["wall_s"] for e in epochs)
        r = {"tables": n, "shards": shards, "shard_sizes": [len(p) for p in parts],
             "epoch_wall_s_p50": walls[len(walls) // 2],
             "ms_per_table_wall": round(1000 * walls[len(walls) // 2] / n, 2),
             "prepare_ms_per_table_sum": round(1000 * sum(e["prepare_s_sum"] for e in epochs) / len(epochs) / n, 2),
             "commit_ms_per_table_sum": round(1000 * sum(e["commit_s_sum"] for e in epochs) / len(epochs) / n, 2),
             "load_avg": round(sum(e["load"] for e in epochs) / len(epochs), 2), "epochs": epochs}
        print({k: v for k, v in r.items() if k != "epochs"}, flush=True)
        return r
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=1000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--changes", type=int, default=3, help="updates per table per epoch")
    ap.add_argument("--shards", default="1,2,1,2", help="processes per round, in order")
    ap.add_argument("--name", default="routed_commit_shards")
    args = ap.parse_args()
    rounds = [one_round(args.tables, int(s), args) for s in args.shards.split(",")]
    by: dict[int, list[float]] = {}
    for r in rounds:
        by.setdefault(r["shards"], []).append(r["epoch_wall_s_p50"])
    base = sorted(by.get(1, [0.0]))[len(by.get(1, [0.0])) // 2]
    ratios = {k: round(base / sorted(v)[len(v) // 2], 2) for k, v in by.items() if base}
    print("speed-up of the epoch's wall time vs 1 shard (medians):", ratios)
    print("\nwrote", write_results(args.name, {"args": vars(args), "speedup": ratios, "rounds": rounds}))


if __name__ == "__main__":
    main()
