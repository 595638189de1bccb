"""CPU time of the mirror path's two Python stages on the rows of ``mirror_path.py``, without a server or Spark.

The 300,000 inserts of ``bench.t`` (int key, text, numeric(12,2), timestamptz, bool, jsonb; 1,000-row
transactions) are built here as the pgoutput messages a peek returns; then, in one process, ``--repeats`` times
(the minimum is reported, as CPU seconds of the process: on a shared machine they move less than wall time):

* **source**: ``stream_batches`` -- pgoutput decode, JSON row text, Arrow batches (what the source's Python
  worker does after its peek), the bulk path and (``bulk=False``) the per-message path;
* **sink**: ``routing.task_tables`` on those batches -- JSON back to typed columns per table (what the sink's
  task does before its keyed prepare);
* the same two stages in the packed shape (``rowFormat=arrow``: ``packed_rows.packed_pieces``, typed from the
  messages, and ``task_tables`` reading the packs), where the code has it.

``PYTHONPATH`` chooses the code: run it once on another checkout (e.g. ``git archive <commit> flinkish_spark``)
to compare (there ``bulk=False`` may not exist: only the default path is timed then).

    python benchmarks/mirror_path_cpu.py [--changes 300000] [--repeats 5] [--name mirror_path_cpu]
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import struct
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _common import write_results  # noqa: E402

COLUMNS = [("id", "integer", "int4", -1), ("name", "text", "text", -1),
           ("amount", "numeric(12,2)", "numeric", (12 << 16 | 2) + 4), ("ts", "timestamp with time zone", "timestamptz", -1),
           ("ok", "boolean", "bool", -1), ("attrs", "jsonb", "jsonb", -1)]


def _tuple(values: list[str]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        raw = v.encode()
        out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


def messages(changes: int, txn: int) -> list[bytes]:
    """What ``pg_logical_slot_peek_binary_changes`` returns for mirror_path.py's backlog (same values)."""
    rel = b"R" + struct.pack(">I", 1) + b"bench\0t\0d" + struct.pack(">h", len(COLUMNS))
    for name, _, _, typmod in COLUMNS:
        rel += bytes([1 if name == "id" else 0]) + name.encode() + b"\0" + struct.pack(">Ii", 25, typmod)
    out, lsn = [rel], 1 << 24
    for lo in range(1, changes + 1, txn):
        lsn += 100_000
        out.append(b"B" + struct.pack(">qqI", lsn, 7_000_000, 1))
        for g in range(lo, min(changes, lo + txn - 1) + 1):
            out.append(b"I" + struct.pack(">I", 1) + b"N" + _tuple([
                str(g), "customer " + hashlib.md5(str(g).encode()).hexdigest(), f"{(g % 100000) / 100:.2f}",
                "2024-01-01 00:00:01.5+00", "t" if g % 3 == 0 else "f", '{"k": %d, "color": "red"}' % g]))
        out.append(b"C\0" + struct.pack(">qqq", lsn, lsn + 8, 7_000_000))
    return out


def best_cpu(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.process_time()
        out = fn()
        times.append(time.process_time() - t)
    return min(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--txn", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="mirror_path_cpu", help="results/<name>.json")
    args = ap.parse_args()
    import flinkish_spark
    from flinkish_spark.connectors.lakehouse.routing import task_tables
    from flinkish_spark.connectors.postgres.pgoutput import relations_in
    from flinkish_spark.connectors.postgres.rows import TableSchema
    from flinkish_spark.connectors.postgres.rows.schema import make_column
    from flinkish_spark.connectors.postgres.source.tables_reader import stream_batches

    schema = TableSchema("bench.t", tuple(make_column(n, d, t, m, None) for n, d, t, m in COLUMNS), ("id",))
    msgs = messages(args.changes, args.txn)
    relations = relations_in(msgs)
    src = SimpleNamespace(component="bench", slot_name="bench")
    paths = {"source": {}} if "bulk" not in inspect.signature(stream_batches).parameters else {"source": {"bulk": True},
                                                                                              "source per-message": {"bulk": False}}
    result: dict[str, Any] = {"code": os.path.dirname(flinkish_spark.__file__), "changes": args.changes,
                              "load_avg": list(os.getloadavg()), "cpu_ms": {}}
    batches: list[Any] = []
    for label, kw in paths.items():
        s, batches = best_cpu(lambda: list(stream_batches(src, msgs, 0, 1 << 62, relations, lambda r: schema, **kw)),
                              args.repeats)
        result["cpu_ms"][label] = round(s * 1000)
    s, _ = best_cpu(lambda: task_tables(iter(batches)), args.repeats)
    result["cpu_ms"]["sink task_tables"] = round(s * 1000)
    packed_pieces: Any = None
    try:  # the packed shape (rowFormat=arrow), where the code has it
        from flinkish_spark.connectors.postgres.source import packed_rows

        packed_pieces = packed_rows.packed_pieces
    except ImportError:
        pass
    if packed_pieces is not None:
        s, packs = best_cpu(lambda: list(packed_pieces(src, [msgs], 0, 1 << 62, relations, lambda r: schema)), args.repeats)
        result["cpu_ms"]["source arrow (packed)"] = round(s * 1000)
        s, _ = best_cpu(lambda: task_tables(iter(packs)), args.repeats)
        result["cpu_ms"]["sink task_tables arrow (packed)"] = round(s * 1000)
        result["stream_rows"] = {"json": sum(b.num_rows for b in batches), "arrow": sum(b.num_rows for b in packs)}
    result["load_avg_after"] = list(os.getloadavg())
    print(f"{result['code']}: {args.changes:,} changes, CPU ms (min of {args.repeats}): {result['cpu_ms']}; "
          f"load {result['load_avg'][0]:.1f} -> {result['load_avg_after'][0]:.1f}")
    print("wrote", write_results(args.name, result))


if __name__ == "__main__":
    main()
