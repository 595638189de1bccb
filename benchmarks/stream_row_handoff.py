"""What Spark's hand-off between a Python source and a Python writer costs per stream-row shape.

The mirror's change rows go from the source's Python reader through the JVM (Arrow -> rows -> Arrow) to the
routing writer's Python worker. Issue 26 (targets 1 and 5) measured that hand-off at ~1.8 s of a 4.8 s epoch of
300k changes with today's row shape: one stream row per change, the table's row as JSON text. This prototype
measures, in one Spark session and alternating, the same N changes of a 10-column table handed over as:

* ``json``: today's shape, one stream row per change (``_table, _op, _lsn, _seq, _commit_ts, _schema_id, row``
  with the row as JSON text);
* ``packed``: one stream row per up to ``--pack`` changes of one table: the same meta columns per change and the
  typed row columns inside one Arrow IPC stream in a binary column, so Spark moves a few large values instead
  of N small ones.

The writer decodes what it gets back into a typed Arrow table in both cases (``pyarrow.json`` for ``json``, IPC
reading for ``packed``), so the figure is hand-off plus decode, what the sink pays today. Wall seconds per run
and the load average are printed; the ratio of the medians is the figure.

    .venv/bin/python benchmarks/stream_row_handoff.py --changes 300000 --runs 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from typing import Any, Iterator

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pyarrow as pa  # noqa: E402
from pyspark.sql.datasource import (  # noqa: E402
    DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage,
)

from _common import print_table, write_results  # noqa: E402

ROW_SCHEMA = pa.schema([("id", pa.int64()), ("a", pa.int32()), ("b", pa.float64()), ("c", pa.string()),
                        ("d", pa.timestamp("us", tz="UTC")), ("e", pa.bool_()), ("f", pa.int64()),
                        ("g", pa.string()), ("h", pa.float64()), ("i", pa.int32())])
META = "_table string, _op string, _lsn bigint, _seq int, _commit_ts timestamp, _schema_id string"


def typed_rows(start: int, n: int) -> pa.Table:
    import numpy as np

    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({
        "id": ids, "a": (ids % 1000).astype(np.int32), "b": ids * 0.5,
        "c": pa.array([f"customer-{i % 997}" for i in ids]),
        "d": pa.array(ids * 1_000_000, pa.timestamp("us", tz="UTC")), "e": ids % 2 == 0, "f": ids * 7,
        "g": pa.array([f"note {i}" for i in ids]), "h": ids * 0.25, "i": (ids % 7).astype(np.int32),
    }, schema=ROW_SCHEMA)


def meta_arrays(start: int, n: int) -> list[pa.Array]:
    import numpy as np

    ids = np.arange(start, start + n, dtype=np.int64)
    return [pa.array(["public.t"] * n), pa.array(["u"] * n), pa.array(ids), pa.array((ids % 1000).astype(np.int32)),
            pa.array(ids * 1000, pa.timestamp("us", tz="UTC")), pa.array(["s1"] * n)]


class _Reader(DataSourceReader):
    def __init__(self, shape: str, changes: int, pack: int) -> None:
        self.shape, self.changes, self.pack = shape, changes, pack

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # Batches are built once per worker process (Spark reuses its Python workers) and kept, so that the timed
        # runs measure the hand-off and the writer's decode, not how this script builds the rows.
        import builtins

        cache = builtins.__dict__.setdefault("_handoff_bench_cache", {})
        key = (self.shape, self.changes, self.pack)
        if key not in cache:
            cache[key] = list(self._build())
        yield from cache[key]

    def _build(self) -> Iterator[pa.RecordBatch]:
        names = ["_table", "_op", "_lsn", "_seq", "_commit_ts", "_schema_id"]
        for start in range(0, self.changes, self.pack):
            n = min(self.pack, self.changes - start)
            rows = typed_rows(start, n)
            if self.shape == "json":
                # pyarrow has no JSON writer: the lines are built as the source builds them (one per row).
                text = pa.array([json.dumps(r, default=str) for r in rows.to_pylist()])
                yield pa.RecordBatch.from_arrays(meta_arrays(start, n) + [text], names=names + ["row"])
            else:
                meta = pa.Table.from_arrays(meta_arrays(start, n), names=names)
                both = meta
                for f in rows.schema:
                    both = both.append_column(f, rows.column(f.name))
                sink = io.BytesIO()
                with pa.ipc.new_stream(sink, both.schema) as w:
                    w.write_table(both)
                one = [pa.array(["public.t"]), pa.array([start]), pa.array([start + n - 1]), pa.array([n], pa.int32()),
                       pa.array([sink.getvalue()], pa.binary())]
                yield pa.RecordBatch.from_arrays(one, names=["_table", "_first", "_last", "_count", "batch"])


class HandoffSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "handoff_bench"

    def schema(self) -> str:
        if self.options.get("shape") == "json":
            return META + ", row string"
        return "_table string, _first bigint, _last bigint, _count int, batch binary"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader(self.options["shape"], int(self.options["changes"]), int(self.options["pack"]))

    def writer(self, schema: Any, overwrite: bool) -> "_Writer":
        return _Writer(self.options["shape"])


class _Count(WriterCommitMessage):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _Writer(DataSourceArrowWriter):
    def __init__(self, shape: str) -> None:
        self.shape = shape

    def write(self, iterator: Iterator[pa.RecordBatch]) -> _Count:
        import pyarrow.json as pj

        rows = 0
        for batch in iterator:
            if self.shape == "json":
                text = "\n".join(batch.column("row").to_pylist()).encode()
                t = pj.read_json(io.BytesIO(text), parse_options=pj.ParseOptions(explicit_schema=ROW_SCHEMA))
                rows += t.num_rows
            else:
                for blob in batch.column("batch").to_pylist():
                    rows += pa.ipc.open_stream(blob).read_all().num_rows
        return _Count(rows)

    def commit(self, messages: list[Any]) -> None:
        total = sum(m.rows for m in messages)
        with open(os.environ["HANDOFF_COUNT_FILE"], "w") as f:
            f.write(str(total))

    def abort(self, messages: list[Any]) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--pack", type=int, default=65_536)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    import tempfile

    from flinkish_spark.session import session

    count_file = os.path.join(tempfile.mkdtemp(prefix="handoff"), "count")
    os.environ["HANDOFF_COUNT_FILE"] = count_file
    spark = session("local[2]", app_name="handoff-bench")
    spark.dataSource.register(HandoffSource)
    walls: dict[str, list[float]] = {"json": [], "packed": []}
    rows = []
    for run in range(args.runs + 1):  # run 0 warms the workers up and is not counted
        for shape in ("json", "packed"):
            t0 = time.perf_counter()
            (spark.read.format("handoff_bench").option("shape", shape).option("changes", args.changes)
             .option("pack", args.pack).load().write.format("handoff_bench").option("shape", shape)
             .mode("append").save())
            wall = time.perf_counter() - t0
            got = int(open(count_file).read())
            assert got == args.changes, (shape, got)
            if run:
                walls[shape].append(wall)
                rows.append([run, shape, f"{wall:.2f}", f"{args.changes / wall:,.0f}", f"{os.getloadavg()[0]:.1f}"])
    spark.stop()
    print_table(["run", "shape", "wall s", "changes/s", "load"], rows)
    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"median json {med['json']:.2f} s, packed {med['packed']:.2f} s: packed is {med['json'] / med['packed']:.2f}x")
    print("written", write_results("stream_row_handoff", {"changes": args.changes, "pack": args.pack,
                                                           "walls": walls, "median": med}))


if __name__ == "__main__":
    main()
