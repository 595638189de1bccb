"""What a Delta table's checkpoint and a process's first load of it cost against the table's history: delta-rs vs the sink's own.

A table of a few files gets H more versions (commits of a txn only, as a long-running stream
leaves: one per epoch), a checkpoint at H, then 10 versions more; measured, each ``--repeats``
times (median, after a round not counted), 10 versions apart:

* delta-rs: ``DeltaTable(path)`` (a process's first load), ``update_incremental()`` +
  ``create_checkpoint()`` of a table object held since (what the keyed commit did every
  ``checkpointInterval`` versions before);
* own: :func:`~flinkish_spark.connectors.delta.state.load_state` + the validation of its
  :class:`~flinkish_spark.connectors.delta.state_table.StateTable` (a process's first load now),
  :func:`~flinkish_spark.connectors.delta.checkpoint.write_checkpoint` from the state caught up
  (the checkpoint now).

    python benchmarks/delta_checkpoint_history.py [--history 10 1000 3000 10000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import write_results  # noqa: E402


def checkpoint(table: Any) -> None:
    """What the keyed commit did every ``checkpointInterval`` versions: the held delta-rs table updated, then checkpointed."""
    table.update_incremental()
    table.create_checkpoint()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--history", type=int, nargs="+", default=[10, 1000, 3000, 10000])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="delta_checkpoint_history")
    args = ap.parse_args()

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from flinkish_spark.connectors.delta.checkpoint import write_checkpoint
    from flinkish_spark.connectors.delta.log import DeltaLog, commit_payload
    from flinkish_spark.connectors.delta.state import load_state
    from flinkish_spark.connectors.delta.state_table import StateTable
    from flinkish_spark.io.fileio import FileIO

    def put(root: str, version: int) -> None:
        with open(f"{root}/_delta_log/{version:020d}.json", "wb") as f:
            f.write(commit_payload("u", version, [], {}, version - 1, blind=True))

    out: list[dict[str, Any]] = []
    for history in args.history:
        root = tempfile.mkdtemp(prefix="flinkish-bench-ckpt-history-")
        try:
            write_deltalake(root, pa.table({"id": list(range(10))}), configuration={"delta.enableDeletionVectors": "true"})
            for i in range(4):
                write_deltalake(root, pa.table({"id": list(range(10 * i, 10 * i + 10))}), mode="append")
            version = 4
            for version in range(5, history + 1):
                put(root, version)
            DeltaTable(root).create_checkpoint()
            log = DeltaLog(FileIO.for_url(root), root)
            state = load_state(log, version)
            held = DeltaTable(root)
            timings: dict[str, list[float]] = {k: [] for k in ("delta-rs load", "delta-rs checkpoint",
                                                               "own load", "own checkpoint")}

            def timed(label: str, fn: Callable[[], Any]) -> None:
                t0 = time.perf_counter()
                fn()
                if repeat:
                    timings[label].append(1000 * (time.perf_counter() - t0))

            last = f"{root}/_delta_log/_last_checkpoint"
            for repeat in range(args.repeats + 1):  # the first round warms up (not counted)
                for _ in range(10):
                    version += 1
                    put(root, version)
                timed("delta-rs load", lambda: DeltaTable(root))
                timed("own load", lambda: StateTable(load_state(log, sys.maxsize)).schema())
                with open(last, "rb") as f:
                    hint = f.read()
                timed("delta-rs checkpoint", lambda: checkpoint(held))
                os.remove(f"{root}/_delta_log/{version:020d}.checkpoint.parquet")  # the own one writes it again
                with open(last, "wb") as g:
                    g.write(hint)
                state.catch_up(log)  # (the commit has it: the version it wrote)
                timed("own checkpoint", lambda: write_checkpoint(log, state, state.version) or 1 / 0)
            row = {"history": history, "log_files": len(os.listdir(f"{root}/_delta_log")),
                 **{k: round(statistics.median(v), 2) for k, v in timings.items()}, "load": os.getloadavg()[0]}
            print(row, flush=True)
            out.append(row)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    print("wrote", write_results(args.name, {"args": vars(args), "rows": out}))


if __name__ == "__main__":
    main()
