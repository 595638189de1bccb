"""The per-changed-table cost of the routed Delta sink without Spark: one task's prepare and the driver's commit.

Issue 26: an epoch of a many-table mirror costs per changed table -- the sink task's prepare
(split, decode, keyed prepare, Parquet files) and the driver's commit (one Delta version each).
Here ``RoutedDeltaSink`` alone (no Spark, no database): N tables ``(id int, v bigint, s text)``
get a snapshot epoch, then ``--epochs`` epochs that change every table (``--changes`` updates
each, hand-made stream rows). Per epoch: the prepare of all tables in one call (one task), the
commit (8 threads after the first table, as in the sink), each divided by N, and the checkpoints
the epoch wrote. With ``--profile prepare|commit`` the cProfile of the last epoch's (or
``--profile-epoch``'s) prepare or commit, top functions by own time, and grouped by module.

The tables' history (what months of a mirror leave): ``--history H`` gives every table H more
versions before the measured epochs (commits of another writer's txn, written straight into the
log, then one delta-rs checkpoint per table), so the log of each table is as long as after H
epochs; repeated, a copy of everything for each H, side by side. The first measured epoch is a
restart. ``--restart-at N`` (repeatable): before epoch N, what a query restarted in a
new driver process starts with -- a new sink object and every per-process cache of the commit
dropped (table states, delta-rs tables and log heads, key indexes, deletion vectors).

Before/after in one run: ``--compare`` runs two copies of everything side by side, epoch by
epoch in turn (the same load): "delta-rs" writes each checkpoint through delta-rs
(``DeltaTable.create_checkpoint``, the sink before the fix) and "own" from the commit's state
(:mod:`flinkish_spark.connectors.delta.checkpoint`). The summary gives per variant the commit
per table of each stretch between restarts, and the mean of the epochs with and without
checkpoints.

    python benchmarks/routed_table_cost.py [--tables 300] [--epochs 3] [--changes 3] [--profile prepare|commit]
        [--profile-epoch E] [--restart-at N ...] [--history H ...] [--compare]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402

VARIANTS = {"delta-rs": False, "own": True}  # name -> the commit writes checkpoints from its own state


class Run:
    """One copy of the benchmark's tables and sink, below its own folder."""

    def __init__(self, variant: str, tables: int, history: int) -> None:
        from flinkish_spark.connectors.lakehouse.routing import Route
        from flinkish_spark.io.fileio import FileIO
        from flinkish_spark.sink.decisions import DecisionLog
        from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

        self.variant, self.history = variant, history
        self.name = f"{variant}, history {history}"
        self.tmp = tempfile.mkdtemp(prefix=f"flinkish-bench-routed-cost-{variant}-{history}-")
        self.meta = os.path.join(self.tmp, "meta")
        self.log = DecisionLog(FileIO.for_url(self.meta), self.meta, "m")
        self.route = Route(os.path.join(self.tmp, "lake", "{schema}", "{table}"), "path")
        self.schemas = [table_schema(f"bench.t_{i:05d}", [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",))
                        for i in range(tables)]
        self.stream = StreamBuilder()
        self.sink = self.new_sink()
        self.out: list[dict[str, Any]] = []

    def new_sink(self) -> Any:
        from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
        from flinkish_spark.io.fileio import FileIO

        return RoutedDeltaSink(FileIO.for_url(self.tmp), self.route, "m", metadata_io=FileIO.for_url(self.meta),
                               metadata_dir=self.log.directory)

    def commit(self, epoch: int, c: Any) -> None:
        from flinkish_spark.sink.committer import commit_epoch

        commit_epoch(self.sink, self.log, epoch, [c], "run")

    def age(self, history: int) -> None:
        """Every table ``history`` versions older: commits of another writer (a txn of its own, no files)."""
        from deltalake import DeltaTable

        from flinkish_spark.connectors.delta.log import commit_payload

        for schema in self.schemas:
            path = self.route.target(schema.table)
            logdir = os.path.join(path, "_delta_log")
            head = max(int(n[:20]) for n in os.listdir(logdir) if n.endswith(".json"))
            for v in range(head + 1, head + history + 1):
                with open(os.path.join(logdir, f"{v:020d}.json"), "wb") as f:
                    f.write(commit_payload("aging", v, [], {}, v - 1, blind=True))
            DeltaTable(path).create_checkpoint()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--changes", type=int, default=3, help="updates per table per epoch")
    ap.add_argument("--profile", choices=("prepare", "commit"), default=None, help="cProfile the last epoch's ...")
    ap.add_argument("--profile-epoch", type=int, default=None, help="the epoch to profile (default: the last)")
    ap.add_argument("--restart-at", type=int, action="append", default=[],
                    help="before this epoch: a new sink and every per-process cache dropped (a new driver process)")
    ap.add_argument("--history", type=int, action="append", default=[],
                    help="versions every table gets before the measured epochs (repeatable: a copy for each)")
    ap.add_argument("--compare", action="store_true", help="delta-rs checkpoints (before) and own (after), in turn")
    ap.add_argument("--name", default="routed_table_cost")
    args = ap.parse_args()
    profile_epoch = args.profile_epoch or args.epochs

    from flinkish_spark.connectors.delta import keyed
    from flinkish_spark.connectors.delta.checkpoint import write_checkpoint
    from flinkish_spark.sink.protocol import PrepareContext

    names = list(VARIANTS) if args.compare else ["own"]
    runs = [Run(n, args.tables, h) for h in (args.history or [0]) for n in names]

    def use(run: Run) -> None:  # the checkpoint writer of the run's variant
        keyed.write_checkpoint = write_checkpoint if VARIANTS[run.variant] else (lambda *a, **k: False)

    try:
        for schema in runs[0].schemas:
            runs[0].stream.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, 21)])
        first = runs[0].stream.batch()
        for run in runs:
            use(run)
            run.commit(0, run.sink.prepare(iter(first.to_batches()), PrepareContext("m", 0, 0, 0)))
            if run.history:
                t0 = time.perf_counter()
                run.age(run.history)
                print(f"{run.name}: {run.history} versions more per table in {time.perf_counter() - t0:.1f} s", flush=True)
        restarts = set(args.restart_at) | {1}  # every copy starts the measured epochs as a new process
        for epoch in range(1, args.epochs + 1):
            for j in range(args.changes):
                runs[0].stream.transaction(*[(schema, "u", {"id": 1 + (epoch * 7 + j) % 20, "v": epoch, "s": "y"})
                                             for schema in runs[0].schemas])
            rows = runs[0].stream.batch()
            for run in runs:
                use(run)
                if epoch in restarts:
                    drop_caches()
                    run.sink = run.new_sink()
                r = measure(run, epoch, rows, args, epoch == profile_epoch, epoch in restarts)
                print({"variant": run.name, **r}, flush=True)
                run.out.append(r)
        summary = {run.name: summarize(run.out) for run in runs}
        print("\nsummary:", json.dumps(summary, indent=1))
        print("wrote", write_results(args.name, {"args": vars(args), "summary": summary,
                                                 "epochs": {run.name: run.out for run in runs}}))
    finally:
        for run in runs:
            shutil.rmtree(run.tmp, ignore_errors=True)


def measure(run: Run, epoch: int, rows: Any, args: argparse.Namespace, profiled: bool, restart: bool) -> dict[str, Any]:
    from flinkish_spark.sink.protocol import PrepareContext

    prof = cProfile.Profile() if args.profile and profiled else None
    before = checkpoints(run.tmp)
    t0 = time.perf_counter()
    if prof and args.profile == "prepare":
        prof.enable()
    c = run.sink.prepare(iter(rows.to_batches()), PrepareContext("m", epoch, 0, 0))
    if prof:
        prof.disable()
    t1 = time.perf_counter()
    if prof and args.profile == "commit":
        prof.enable()
    run.commit(epoch, c)
    if prof:
        prof.disable()
    t2 = time.perf_counter()
    r = {"epoch": epoch, "rows": rows.num_rows, "prepare_s": round(t1 - t0, 3), "commit_s": round(t2 - t1, 3),
         "prepare_ms_per_table": round(1000 * (t1 - t0) / args.tables, 2),
         "commit_ms_per_table": round(1000 * (t2 - t1) / args.tables, 2),
         "checkpoints": checkpoints(run.tmp) - before, "restart": restart, "load": os.getloadavg()[0]}
    if prof:
        print_profile(prof, args.tables)
    return r


def print_profile(prof: cProfile.Profile, tables: int) -> None:
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
        print(f"  {1000 * t / tables:7.2f}  {key}")


def drop_caches() -> None:
    """What a new driver process starts with: nothing of the commit cached."""
    from flinkish_spark.connectors.delta import live, table
    from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

    live._STATES.clear()
    live._forget_vectors()
    table._TABLES.clear()
    table._HEADS.clear()
    CACHE.clear()


def checkpoints(root: str) -> int:
    """Checkpoint files below ``root`` (every table's ``_delta_log``)."""
    return sum(1 for _, _, names in os.walk(os.path.join(root, "lake")) for n in names if ".checkpoint." in n)


def summarize(out: list[dict[str, Any]]) -> dict[str, Any]:
    """Commit ms per table: each stretch between restarts (its first epoch, the next 3, the last 3, the slowest),
    and the mean of the epochs with and without checkpoints (restarts left out)."""
    stretches: list[list[dict[str, Any]]] = []
    for r in out:
        if r["restart"] or not stretches:
            stretches.append([])
        stretches[-1].append(r)

    def mean(rs: list[dict[str, Any]]) -> float | None:
        return round(sum(r["commit_ms_per_table"] for r in rs) / len(rs), 2) if rs else None

    return {"stretches": [{"epochs": f"{s[0]['epoch']}-{s[-1]['epoch']}", "first": s[0]["commit_ms_per_table"],
                           "next_3": mean(s[1:4]), "last_3": mean(s[-3:]),
                           "max": max(r["commit_ms_per_table"] for r in s)} for s in stretches],
            "mean_with_checkpoints": mean([r for r in out if r["checkpoints"] and not r["restart"]]),
            "mean_without": mean([r for r in out if not r["checkpoints"] and not r["restart"]]),
            "load": [round(out[0]["load"], 1), round(out[-1]["load"], 1)]}


if __name__ == "__main__":
    main()
