"""Why the routed Delta commit per table grows with the tables' history (investigation, no Spark).

``RoutedDeltaSink`` alone, as benchmarks/routed_table_cost.py: N tables ``(id int, v bigint, s text)``
of ``--rows`` rows get a snapshot epoch, then ``--epochs`` epochs that update ``--keys`` random keys
of every table. Then a "restart": every per-process cache of the commit dropped (DeltaState per
table, delta-rs tables and log heads, key indexes, deletion vectors) and a new sink object, and
``--after`` more epochs. Per epoch: commit ms per table, live files per table, and the time in the
commit's phases (wrapped functions, ms per table). cProfile of the epochs in ``--profile``
(``r1`` = the first epoch after the restart). ``--threads`` N > 1: the tables committed N at a time, as on object
storage (COMMIT_THREADS; a local disk otherwise stages the versions behind one sync, in the main thread, so the
profile sees it all).

    python benchmarks/routed_commit_growth.py [--tables 200] [--epochs 40] [--keys 5] [--rows 20]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402

PHASES: dict[str, float] = defaultdict(float)
COUNTS: dict[str, int] = defaultdict(int)
_LOCK = threading.Lock()


def timed(owner: Any, name: str, label: str) -> None:
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            with _LOCK:
                PHASES[label] += time.perf_counter() - t0
                COUNTS[label] += 1

    setattr(owner, name, wrapper)


def instrument() -> None:
    import deltalake

    from flinkish_spark.connectors.delta import epoch_commit, keyed, live, log, routed, state, table
    from flinkish_spark.connectors.lakehouse import key_lookup
    from flinkish_spark.connectors.delta import deletion_vectors

    timed(live, "table_state", "table_state (all calls)")
    timed(live, "load_state", "load_state (checkpoint + commits)")
    from flinkish_spark.connectors.delta import evolve
    timed(evolve.RoutedDeltaTarget, "validate", "validate (delta-rs load)")
    timed(routed.RoutedDeltaSink, "_commit_table", "_commit_table")
    timed(routed.RoutedDeltaSink, "cleanup", "cleanup (sink)")
    timed(epoch_commit.EpochCommit, "build", "EpochCommit.build")
    timed(key_lookup.KeyLookup, "find", "KeyLookup.find")
    timed(key_lookup.KeyLookup, "_build", "KeyLookup._build (cold key index)")
    timed(deletion_vectors, "read_vector", "read_vector")
    live.read_vector = deletion_vectors.read_vector  # live imported the name
    timed(keyed, "after_keyed", "after_keyed (checkpoint)")
    timed(deltalake.DeltaTable, "create_checkpoint", "delta-rs create_checkpoint")
    timed(deltalake.DeltaTable, "update_incremental", "delta-rs update_incremental")
    timed(deltalake.DeltaTable, "__init__", "delta-rs DeltaTable() load")
    timed(log.DeltaLog, "write_version", "write_version")
    timed(state.DeltaState, "catch_up", "DeltaState.catch_up")
    timed(table.DeltaTarget, "check_same_table", "check_same_table")
    # keyed and evolve imported the name: point them at the wrapper
    keyed.table_state = live.table_state
    evolve.table_state = live.table_state


def drop_caches() -> None:
    """What a new commit process starts with: nothing cached."""
    from flinkish_spark.connectors.delta import live, table
    from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

    live._STATES.clear()
    live._forget_vectors()  # (a Spark restart in the same Python worker keeps it: see --no-drop)
    table._TABLES.clear()
    table._HEADS.clear()
    CACHE.clear()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tables", type=int, default=200)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--after", type=int, default=5, help="epochs after the simulated restart")
    ap.add_argument("--keys", type=int, default=5, help="random keys updated per table per epoch")
    ap.add_argument("--rows", type=int, default=20, help="rows per table")
    ap.add_argument("--threads", type=int, default=1, help="N > 1: COMMIT_THREADS at a time, as on object storage")
    ap.add_argument("--profile", default="1,20,40,r1", help="epochs to cProfile (rN: N-th after the restart)")
    ap.add_argument("--checkpoint-interval", type=int, default=10)
    ap.add_argument("--no-spread", action="store_true",
                    help="every table checkpoints at the multiples of the interval (before the per-table offset)")
    ap.add_argument("--name", default="routed_commit_growth")
    args = ap.parse_args()

    from flinkish_spark.connectors.delta import live, routed
    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext
    from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

    instrument()
    if args.no_spread:
        routed.checkpoint_offset = lambda path, interval: 0
    routed.COMMIT_THREADS = args.threads
    if args.threads > 1:  # the object storage path on this local disk
        routed.staged_writes = lambda io: False
    if args.threads == 1:  # every table in the calling thread, so that cProfile sees them
        class Inline:
            def __init__(self, *a: Any, **k: Any) -> None:
                pass

            def __enter__(self) -> "Inline":
                return self

            def __exit__(self, *a: Any) -> None:
                pass

            def map(self, fn: Callable[..., Any], items: Any) -> Any:
                return map(fn, items)

        routed.ThreadPoolExecutor = Inline  # type: ignore[misc,assignment]
    profile_at = set(args.profile.split(",")) if args.profile else set()
    rng = random.Random(7)
    tmp = tempfile.mkdtemp(prefix="flinkish-bench-commit-growth-")
    try:
        meta = os.path.join(tmp, "meta")
        log = DecisionLog(FileIO.for_url(meta), meta, "m")
        route = Route(os.path.join(tmp, "lake", "{schema}", "{table}"), "path")

        def new_sink() -> RoutedDeltaSink:
            return RoutedDeltaSink(FileIO.for_url(tmp), route, "m", metadata_io=FileIO.for_url(meta),
                                   metadata_dir=log.directory, checkpoint_interval=args.checkpoint_interval)

        sink = new_sink()
        schemas = [table_schema(f"bench.t_{i:05d}", [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",))
                   for i in range(args.tables)]
        s = StreamBuilder()
        for schema in schemas:
            s.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, args.rows + 1)])
        commit_epoch(sink, log, 0, [sink.prepare(iter(s.batch().to_batches()), PrepareContext("m", 0, 0, 0))], "run")
        out: list[dict[str, Any]] = []
        profiles: dict[str, str] = {}
        total = args.epochs + args.after
        t_restart = None
        for epoch in range(1, total + 1):
            label = str(epoch) if epoch <= args.epochs else f"r{epoch - args.epochs}"
            if epoch == args.epochs + 1:
                drop_caches()
                sink = new_sink()
                t0 = time.perf_counter()
                last = sink.last_committed_epoch()
                t_restart = time.perf_counter() - t0
                print(f"restart: caches dropped; last_committed_epoch() = {last} in {t_restart:.2f} s "
                      f"({1000 * t_restart / args.tables:.1f} ms per table)", flush=True)
                drop_caches()  # measure the epochs with the caches cold, as a new process
            for j in range(args.keys):
                s.transaction(*[(schema, "u", {"id": rng.randint(1, args.rows), "v": epoch, "s": "y"})
                                for schema in schemas])
            rows = s.batch()
            c = sink.prepare(iter(rows.to_batches()), PrepareContext("m", epoch, 0, 0))
            PHASES.clear()
            COUNTS.clear()
            prof = cProfile.Profile() if label in profile_at else None
            t1 = time.perf_counter()
            if prof:
                prof.enable()
            commit_epoch(sink, log, epoch, [c], "run")
            if prof:
                prof.disable()
            t2 = time.perf_counter()
            states = [st for k, st in live._STATES.items()]
            files = [len(st.files) for st in states]
            dvs = [sum(1 for f in st.files.values() if f.dv is not None) for st in states]
            version = max((st.version for st in states), default=-1)
            t0dir = os.path.join(tmp, "lake", "bench", "t_00000", "_delta_log")
            r = {"epoch": label, "version": version, "commit_ms_per_table": round(1000 * (t2 - t1) / args.tables, 2),
                 "live_files_avg": round(sum(files) / max(len(files), 1), 1), "live_files_max": max(files, default=0),
                 "files_with_dv_avg": round(sum(dvs) / max(len(dvs), 1), 1),
                 "dv_cache_entries": len(live._DV_CACHE),
                 "log_entries_t0": len(os.listdir(t0dir)),
                 "phases_ms_per_table": {k: round(1000 * v / args.tables, 2) for k, v in sorted(PHASES.items())},
                 "calls": dict(sorted(COUNTS.items())), "load": round(os.getloadavg()[0], 2)}
            print({k: v for k, v in r.items() if k not in ("phases_ms_per_table", "calls")}, flush=True)
            print("   ", "  ".join(f"{k}={v}" for k, v in r["phases_ms_per_table"].items()), flush=True)
            out.append(r)
            if prof:
                text = io.StringIO()
                stats = pstats.Stats(prof, stream=text)
                stats.sort_stats("tottime").print_stats(18)
                stats.sort_stats("cumulative").print_stats(r"flinkish_spark|deltalake", 30)
                profiles[label] = text.getvalue()
                print(f"--- cProfile of epoch {label} ---")
                print(text.getvalue(), flush=True)
        before = [r["commit_ms_per_table"] for r in out[:args.epochs]]
        summary = {"commit_ms_per_table_mean": round(sum(before) / len(before), 2),
                   "commit_ms_per_table_max_epoch": max(before),
                   "commit_ms_per_table_p50_epoch": sorted(before)[len(before) // 2]}
        print("summary (epochs before the restart):", summary)
        print("\nwrote", write_results(args.name, {"args": vars(args), "restart_last_committed_epoch_s": t_restart,
                                                   "summary": summary, "epochs": out}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
