"""The packed stream shape (``rowFormat=arrow``) gives a routing sink what the JSON shape gives it, in process.

The stream is ``stream_rows_pg18.json``'s (a real server's rows: every column kind with NULLs, NaN, infinities, BC
dates, arrays, bytea; updates, a key change, key-only deletes; TOAST-unchanged values under default and FULL
identity; a column added mid-range; a truncate) plus made rows for a snapshot with re-snapshot markers and a
keyless table; it is cut into small source batches so that a schema change falls between two packs.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flinkish_spark.connectors.lakehouse.packed import PackedDecode
from flinkish_spark.connectors.lakehouse.task_decode import TaskDecode
from flinkish_spark.connectors.postgres.rows.packed import PACKED_ARROW, Packer, is_packed, unpack_json
from flinkish_spark.testing.stream_rows import ARROW, StreamBuilder, table_schema

FIXTURE = Path(__file__).parents[1] / "postgres" / "stream_rows_pg18.json"
SNAP = table_schema("public.snap", [("id", "int"), ("v", "text"), ("n", "numeric(12,2)")], ("id",))
KEYLESS = table_schema("public.keyless", [("a", "int"), ("b", "text")], ())


def recorded() -> pa.Table:
    rows = json.loads(FIXTURE.read_text())["rows"]
    for r in rows:
        if isinstance(r["_commit_ts"], str):
            r["_commit_ts"] = datetime.fromisoformat(r["_commit_ts"])
    return pa.Table.from_pylist(rows, schema=ARROW)


def made() -> pa.Table:
    s = StreamBuilder(lsn=1 << 30)
    s.marker(SNAP, "B").snapshot(SNAP, [{"id": i, "v": f"v{i}", "n": i / 4} for i in range(1, 8)]).marker(SNAP, "E")
    s.transaction((KEYLESS, "c", {"a": 1, "b": "x"}), (SNAP, "u", {"id": 1, "v": "one", "n": 1}),
                  (KEYLESS, "c", {"a": 1, "b": "x"}), (SNAP, "d", {"id": 2}), (KEYLESS, "t", None))
    return s.batch()


def stream(cut: int) -> list[pa.RecordBatch]:
    return recorded().to_batches(max_chunksize=cut) + made().to_batches(max_chunksize=cut)


def as_text(t: pa.Table) -> str:
    return json.dumps(t.to_pylist(), default=str)  # NaN and nested values compared as their text


@pytest.mark.parametrize("defer", [False, True], ids=["typed-in-source", "typed-in-sink"])
def test_the_packed_shape_decodes_to_the_same_tables_schemas_rows_and_figures(tmp_path: Path, defer: bool) -> None:
    batches = stream(cut=5)
    plain = TaskDecode(7)
    for b in batches:
        plain.add(b)
    packer, packed = Packer(defer), PackedDecode()
    packs = [packer.pack(b) for b in batches]
    assert all(p.schema.equals(PACKED_ARROW) and is_packed(p.schema.names) for p in packs)
    ops = set(pc.unique(pa.concat_arrays([p.column("_op") for p in packs])).to_pylist())
    assert ops == ({"s", "j"} if defer else {"s", "p"})  # decodeIn=sink: no pack typed in the source
    assert sum(p.num_rows for p in packs) < sum(b.num_rows for b in batches)
    for p in packs:
        packed.add(p)
    want, got = plain.result(), packed.result()
    assert sorted(got) == sorted(want) == ["public.docs", "public.everything", "public.full_docs", "public.keyless",
                                           "public.snap"]
    for name, (rows, joined, figures, earlier) in want.items():
        g_rows, g_joined, g_figures, g_earlier = got[name]
        assert [s.schema_id for s in g_rows.schemas] == [s.schema_id for s in rows.schemas], name
        assert g_joined.schema.remove_metadata().equals(joined.schema.remove_metadata()), name
        assert as_text(g_joined) == as_text(joined), name
        assert (g_figures, g_earlier) == (figures, earlier), name
    assert len(want["public.docs"][0].schemas) == 2  # the column added mid-range: two schemas, one target


def test_routed_delta_targets_are_identical_from_either_shape(tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    import deltalake

    from flinkish_spark.connectors.delta.routed import RoutedDeltaSink
    from flinkish_spark.connectors.lakehouse.routing import Route
    from flinkish_spark.io.fileio import FileIO
    from flinkish_spark.sink.committer import commit_epoch
    from flinkish_spark.sink.decisions import DecisionLog
    from flinkish_spark.sink.protocol import PrepareContext

    keyed = made().filter(pc.not_equal(made().column("_table"), "public.keyless"))  # a routed target needs a key
    targets = {}
    for shape in ("json", "arrow", "arrow-typed-in-sink"):
        root, meta = tmp_path / shape, str(tmp_path / shape / "meta")
        log = DecisionLog(FileIO.for_url(meta), meta, "m")
        sink = RoutedDeltaSink(FileIO.for_url(str(root / "lake")), Route(str(root / "lake" / "{schema}" / "{table}"), "path"),
                               "m", checkpoint_interval=3, create_table=True, metadata_io=FileIO.for_url(meta),
                               metadata_dir=log.directory)
        packer = Packer(defer=shape.endswith("in-sink"))
        for epoch, rows in enumerate((recorded(), keyed)):
            batches = rows.to_batches(max_chunksize=4)
            if shape != "json":
                batches = [packer.pack(b) for b in batches]
            commit_epoch(sink, log, epoch, [sink.prepare(iter(batches), PrepareContext("m", epoch, 0, 0))], "run")
        targets[shape] = {t: as_text(pa.table(deltalake.DeltaTable(str(root / "lake" / t.replace(".", "/"))).scan()))
                          for t in ("public.docs", "public.everything", "public.full_docs", "public.snap")}
    assert targets["arrow"] == targets["json"] == targets["arrow-typed-in-sink"]
    assert json.loads(targets["arrow"]["public.snap"]) and not json.loads(targets["arrow"]["public.docs"])  # truncated


def test_unpacked_deferred_packs_are_the_json_rows_exactly() -> None:
    """``j`` packs (decodeIn=sink) hold the JSON rows as read: unpacked, they are those rows, nothing lost."""
    batches = stream(cut=5)
    packer = Packer(defer=True)
    back = unpack_json(pa.Table.from_batches([packer.pack(b) for b in batches])).to_pylist()
    key = lambda r: (r["_table"], r["_lsn"] is not None, r["_lsn"] or 0, r["_seq"] or 0, r["_op"], r["row"] or "")  # noqa: E731
    assert sorted(back, key=key) == sorted(pa.Table.from_batches(batches).to_pylist(), key=key)


def test_unpacked_rows_are_the_json_rows_but_for_what_arrow_cannot_hold() -> None:
    """What the PostgreSQL routed sink stages from packed rows: the JSON rows again (a delete's key only, a
    TOAST-unchanged update without its column), but NaN in a numeric, infinite and BC dates, multi-dimensional
    arrays are null -- why ``flinkish mirror`` to PostgreSQL keeps the JSON shape."""
    batches = stream(cut=5)
    packer = Packer()
    back = unpack_json(pa.Table.from_batches([packer.pack(b) for b in batches])).to_pylist()
    orig = pa.Table.from_batches(batches).to_pylist()
    key = lambda r: (r["_table"], r["_lsn"] is not None, r["_lsn"] or 0, r["_seq"] or 0, r["_op"], r["row"] if r["_op"] == "r" else "")  # noqa: E731
    assert len(back) == len(orig)
    lossy = {"n", "d", "ts", "tstz", "an", "aa", "f4"}  # NaN numeric, infinities, BC, n-D arrays; float4 re-printed
    for a, b in zip(sorted(orig, key=key), sorted(back, key=key)):
        assert {k: v for k, v in a.items() if k != "row"} == {k: v for k, v in b.items() if k != "row"}
        if a["row"] is None or a["_op"] == "s":
            assert b["row"] == a["row"]
            continue
        want, got = json.loads(a["row"]), json.loads(b["row"])
        assert sorted(got) == sorted(want)  # the same columns: key-only deletes, unchanged columns left out
        assert {k: v for k, v in got.items() if k not in lossy} == {k: v for k, v in want.items() if k not in lossy}



def test_untyped_packs_before_their_schema_row_wait_for_it_and_without_it_are_refused() -> None:
    """A j pack whose 's' row comes later in the task (a shuffle that did not keep the source's order) is typed
    once it has come: the same tables; a task that never gets the 's' row is refused, naming the table."""
    packer = Packer(defer=True)
    packs = pa.Table.from_batches([packer.pack(b) for b in stream(cut=5)])
    is_s = pc.equal(packs.column("_op"), "s")
    in_order, reversed_ = PackedDecode(), PackedDecode()
    in_order.add(pa.Table.from_batches(packs.to_batches()).combine_chunks().to_batches()[0])
    for part in (packs.filter(pc.invert(is_s)), packs.filter(is_s)):  # every pack first, the schema rows after
        for b in part.to_batches():
            reversed_.add(b)
    want, got = in_order.result(), reversed_.result()
    assert sorted(got) == sorted(want)
    for name in want:
        assert as_text(got[name][1]) == as_text(want[name][1]), name
    lost = PackedDecode()
    for b in packs.filter(pc.invert(is_s)).to_batches():
        lost.add(b)
    with pytest.raises(ValueError, match=r"rows of public\.\w+ name schemas .* without an 's' row in the same task"):
        lost.result()
