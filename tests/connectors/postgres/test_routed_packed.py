"""The PostgreSQL routed sink takes the packed shape (``rowFormat=arrow``) too: the same epochs, once in each shape
into targets of their own, leave the same rows (in process, no Spark)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.postgres.rows.packed import Packer
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema
from tests.connectors.postgres.test_routed import Mirror

psycopg = pytest.importorskip("psycopg")


def epochs(prefix: str) -> list[pa.Table]:
    a = table_schema(f"public.{prefix}a", [("id", "int"), ("v", "text"), ("n", "numeric(12,2)")], ("id",))
    b = table_schema(f"public.{prefix}b", [("k", "text"), ("f", "float8"), ("ok", "bool")], ("k",))
    s = StreamBuilder()
    s.snapshot(a, [{"id": i, "v": f"a{i}", "n": f"{i}.25"} for i in range(1, 6)])
    s.snapshot(b, [{"k": "x", "f": 0.1, "ok": True}, {"k": "y", "f": float("nan"), "ok": False}])
    first = s.batch()
    s.transaction((a, "u", {"id": 1, "v": "one", "n": "1.10"}), (a, "d", {"id": 2}), (b, "t", None),
                  (b, "c", {"k": "z", "f": 1e-300, "ok": None}), (a, "c", {"id": 9, "v": 'q"uote\\', "n": None}))
    return [first, s.batch()]


def test_packed_and_json_epochs_leave_the_same_rows(pg_url, tmp_path: Path) -> None:
    m = Mirror(tmp_path, pg_url)
    for e in epochs("j"):
        m.epoch(e)
    packer = Packer()
    for e in epochs("p"):
        m.epoch(pa.Table.from_batches([packer.pack(b) for b in e.to_batches(max_chunksize=3)]))
    for t, key in (("a", "id"), ("b", "k")):
        json_rows, packed_rows = m.rows(f"public_j{t}", key), m.rows(f"public_p{t}", key)
        assert repr(packed_rows) == repr(json_rows) and json_rows  # repr: NaN equals itself
    assert m.rows("public_pa", "id")[-1] == (9, 'q"uote\\', None)
