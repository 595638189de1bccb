"""trackHistoryColumns' cost on a routed Delta history target, in process (no Spark): the same epochs with every
column tracked and with one tracked column, side by side in one run.

A table of ``--keys`` rows (snapshot), then ``--epochs`` epochs each updating every key once: 'v' always, the
tracked column 'n' for half the keys -- so with tracking half the changes update the current version in place
(the commit reads the tracked columns of the versions and the table's current rows to decide). Reports each
epoch's prepare + commit seconds, the target's rows at the end and the load average.

    PYTHONPATH=. python benchmarks/tracked_history.py --keys 100000 --epochs 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks._common import machine  # noqa: E402


def run(keys: int, epochs: int, options: dict[str, str]) -> tuple[list[float], int]:
    import deltalake
    import pyarrow as pa

    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext
    from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

    tmp = Path(tempfile.mkdtemp(prefix="tracked-"))
    meta = str(tmp / "meta")
    modes = parse_table_modes(options.get, "bench")

    def sink() -> RoutedDeltaSink:
        log = DecisionLog(FileIO.for_url(meta), meta, "b")
        return RoutedDeltaSink(FileIO.for_url(str(tmp / "lake")), Route(str(tmp / "lake" / "{schema}" / "{table}"), "path"),
                               "b", metadata_io=FileIO.for_url(meta), metadata_dir=log.directory, modes=modes)

    def epoch(e: int, batch: pa.Table) -> float:
        t = time.perf_counter()
        prepared = [sink().prepare(iter(batch.to_batches()), PrepareContext("b", e, 0, 0))]
        commit_epoch(sink(), DecisionLog(FileIO.for_url(meta), meta, "b"), e, prepared, "run")
        return time.perf_counter() - t

    d = table_schema("public.t", [("id", "bigint"), ("v", "text"), ("n", "int")], ("id",))
    s = StreamBuilder()
    s.snapshot(d, [{"id": i, "v": f"s{i}", "n": 0} for i in range(keys)])
    epoch(0, s.batch())
    times = []
    for e in range(1, epochs + 1):
        s.transaction(*[(d, "u", {"id": i, "v": f"e{e}-{i}", "n": e - 1 if i % 2 else e}) for i in range(keys)])
        times.append(epoch(e, s.batch()))
    rows = pa.table(deltalake.DeltaTable(str(tmp / "lake" / "public" / "t")).scan()).num_rows
    return times, rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = {"machine": machine(), "keys": a.keys, "epochs": a.epochs, "runs": []}
    for name, options in (("history", {"mode": "history"}),
                          ("history, trackHistoryColumns=n", {"mode": "history", "trackHistoryColumns": "n"}),
                          ("history (again)", {"mode": "history"}),
                          ("history, trackHistoryColumns=n (again)", {"mode": "history", "trackHistoryColumns": "n"})):
        load = os.getloadavg()[0]
        times, rows = run(a.keys, a.epochs, options)
        out["runs"].append({"shape": name, "epoch_s": [round(t, 3) for t in times], "rows": rows, "load": round(load, 1)})
        print(f"{name:42s} epochs {', '.join(f'{t:.2f}' for t in times)} s, {rows} rows, load {load:.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
