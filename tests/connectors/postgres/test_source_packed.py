"""The packed shape's typed path (``rowFormat=arrow``, :mod:`flinkish_spark.connectors.postgres.source.packed_rows`)
gives a sink the tables the JSON shape gives it: the streams of ``test_source_stream_bulk`` (every encoding, NaN and
infinities, bytea, arrays, TOAST-unchanged values, old keys, FULL identity, a keyless table, a column added midway,
a truncate, a table not followed), decoded once the JSON way and packed after, once typed from the messages."""

from __future__ import annotations

import json
import random
import struct
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.packed import PackedDecode
from flinkish_spark.connectors.postgres.pgoutput import Relation, relations_in
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.rows.packed import Packer, is_packed
from flinkish_spark.connectors.postgres.source import packed_rows
from flinkish_spark.connectors.postgres.source.stream_rows import stream_pieces
from tests.connectors.postgres.test_source_stream_bulk import (  # noqa: F401
    COLUMNS, Stream, _mixed_stream, _row, delete, insert, small_runs, update,
)


def tables(s: Stream, packed: bool, start: int = 0, end: int = 1 << 62, decode_in: str = "source",
           ops: set[str] | None = None, piece: int = 97, cuts: list[int] | None = None) -> dict[str, Any]:
    relations = relations_in(s.messages)

    def resolve(rel: Relation) -> TableSchema | None:
        return s.schemas[(rel.relid, rel.names)]

    src = SimpleNamespace(component="test", slot_name="s", decode_in=decode_in)
    pieces = [s.messages[i:i + piece] for i in range(0, len(s.messages), piece)]  # cut anywhere, as peeks are
    if cuts is not None:
        pieces = [s.messages[a:b] for a, b in zip([0] + cuts, cuts + [len(s.messages)]) if b > a]
    if packed:
        batches = list(packed_rows.packed_pieces(src, pieces, start, end, relations, resolve))
    else:
        batches = list(Packer().pack_all(stream_pieces(src, pieces, start, end, relations, resolve)))
    assert all(is_packed(b.schema.names) for b in batches)
    if ops is not None:
        ops.update(op for b in batches for op in b.column("_op").to_pylist())
    decode = PackedDecode()
    for b in batches:
        decode.add(b)
    return {name: (json.dumps(joined.to_pylist(), default=str), [x.schema_id for x in rows.schemas], figures, earlier)
            for name, (rows, joined, figures, earlier) in decode.result().items()}


@pytest.mark.parametrize("decode_in", ["source", "sink"])
@pytest.mark.parametrize("seed", [1, 2])
def test_typed_packs_hold_what_the_json_rows_decode_to(small_runs: None, seed: int, decode_in: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    typed = []
    run = packed_rows._PackedStream._typed_run

    def counted(self: Any, *a: Any) -> Any:
        out = run(self, *a)
        typed.append(out is not None and out.num_rows > 0)
        return out

    monkeypatch.setattr(packed_rows._PackedStream, "_typed_run", counted)
    s = _mixed_stream(seed)
    ops: set[str] = set()
    want, got = tables(s, packed=False), tables(s, packed=True, decode_in=decode_in, ops=ops)
    assert sorted(got) == sorted(want) == ["public.full", "public.nokey", "public.wide"]
    for name in want:
        assert got[name] == want[name], name
    assert sum(typed) >= 5  # the long runs of inserts went the typed way
    # decodeIn=sink: pieces of plain changes as w packs, the others' rows in j packs (and their runs typed in p
    # packs), all typed by the sink (PackedDecode)
    assert ops == ({"s", "p", "j", "w"} if decode_in == "sink" else {"s", "p"})


@pytest.mark.parametrize("piece", [7, 40, 333, 100_000])
@pytest.mark.parametrize("seed", [3, 4])
def test_w_packs_hold_what_the_json_rows_decode_to_wherever_the_pieces_are_cut(small_runs: None, seed: int,
                                                                              piece: int) -> None:
    """decodeIn=sink ships a piece's plain changes as their messages (.source.wire_rows) and the sink types them
    (.rows.wire): the same tables as the JSON way -- values, _op, _lsn, _seq (the 's' rows take one), figures --
    with TOAST-unchanged values (typed message by message), a table not followed, a keyless one, deletes of full
    rows, and pieces that do not qualify (old keys, a truncate, a schema change) between, in a range cut mid-stream."""
    s = _mixed_stream(seed)
    lsns = sorted({struct.unpack(">q", m[1:9])[0] for m in s.messages if m[:1] == b"B"})
    for start, end in ((0, 1 << 62), (lsns[2], lsns[-3])):
        ops: set[str] = set()
        want = tables(s, packed=False, start=start, end=end, piece=piece)
        got = tables(s, packed=True, start=start, end=end, decode_in="sink", ops=ops, piece=piece)
        assert sorted(got) == sorted(want) == ["public.full", "public.nokey", "public.wide"]
        for name in want:
            assert got[name] == want[name], (name, start, end)
        assert "w" in ops or piece > 40  # a big piece holds a change that does not qualify: all of it the old way


def _many_tables_stream(seed: int, tables: int = 20, txns: int = 300) -> Stream:
    """What a database of many tables sends: transactions of changes to 3 random tables, each table's Relation
    message inside the transaction of its first change; plain inserts, updates (some with TOAST-unchanged values),
    deletes of a key or, for a table of identity FULL, of the whole row; one table not followed."""
    r = random.Random(seed)
    s = Stream()
    cols = COLUMNS[:6]
    announced: set[int] = set()
    for _ in range(txns):
        changes = []
        for relid in r.sample(range(1, tables + 1), 3):
            if relid not in announced:
                announced.add(relid)
                s.relation(relid, f"public.t{relid}", cols, identity="f" if relid == 2 else "d",
                           key=(tuple(c[0] for c in cols) if relid == 2 else ("id",)), followed=relid != 3)
                changes.append(s.messages.pop())
            i = r.randint(1, 10**6)
            p = r.random()
            if p < 0.4:
                changes.append(insert(relid, _row(r, i, cols)))
            elif p < 0.7:
                changes.append(update(relid, _row(r, i, cols)))
            elif p < 0.8:
                changes.append(update(relid, [v if j % 2 == 0 else "u" for j, v in enumerate(_row(r, i, cols))]))
            else:
                changes.append(delete(relid, _row(r, i, cols) if relid == 2 else [str(i)] + [None] * (len(cols) - 1),
                                      tag=b"O" if relid == 2 else b"K"))
        s.txn(changes)
    return s


@pytest.mark.parametrize("piece", [50, 100_000])
def test_a_many_table_stream_goes_as_w_packs_whole(small_runs: None, piece: int) -> None:
    """The stream of a many-table database qualifies piece by piece: every change in w packs (flushed every
    BATCH_ROWS), none typed in the source, the same tables as the JSON way."""
    s = _many_tables_stream(5)
    ops: set[str] = set()
    want = tables(s, packed=False, piece=piece)
    got = tables(s, packed=True, decode_in="sink", ops=ops, piece=piece)
    assert len(want) == 19 and sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    assert ops == {"s", "w"}


def test_a_table_with_a_whole_pack_pending_sends_it_while_the_read_goes_on(small_runs: None,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """decodeIn=sink: a table whose pending changes make a whole pack (PACK_ROWS) goes to its sink task before the
    read ends -- the sink types it while the source reads on -- and the tables are still those of the JSON way."""
    from flinkish_spark.connectors.postgres.source import stream_rows, wire_rows

    monkeypatch.setattr(wire_rows, "PACK_ROWS", 40)
    monkeypatch.setattr(stream_rows, "BATCH_ROWS", 10_000)  # the flush of all tables far off
    s = _many_tables_stream(6, tables=4, txns=200)  # ~150 changes per table, far below FLUSH_BATCHES * BATCH_ROWS
    want = tables(s, packed=False, piece=50)
    got = tables(s, packed=True, decode_in="sink", piece=50)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], name
    relations = relations_in(s.messages)
    src = SimpleNamespace(component="test", slot_name="s", decode_in="sink")
    pieces = [s.messages[i:i + 50] for i in range(0, len(s.messages), 50)]
    read = 0

    def counted() -> Any:
        nonlocal read
        for p in pieces:
            read += 1
            yield p

    first_w = None
    for b in packed_rows.packed_pieces(src, counted(), 0, 1 << 62, relations,
                                       lambda rel: s.schemas[(rel.relid, rel.names)]):
        if first_w is None and "w" in b.column("_op").to_pylist():
            first_w = read
    assert first_w is not None and first_w < len(pieces) // 2, (first_w, len(pieces))


def test_typed_column_reads_each_text_as_the_json_shape_does() -> None:
    from flinkish_spark.connectors.postgres.rows.decode import decode_rows
    from flinkish_spark.connectors.postgres.rows.encode import value_encoder
    from flinkish_spark.connectors.postgres.rows.schema import make_column

    cases: list[tuple[tuple[Any, ...], list[str | None]]] = [
        (("n", "numeric(12,2)", "numeric", (12 << 16 | 2) + 4, None), ["1.50", "-0.01", "NaN", None]),
        (("f", "real", "float4", -1, None), ["3.4e+38", "NaN", "-Infinity", "0.1"]),
        (("d", "date", "date", -1, None), ["2024-02-29", "infinity", "0044-03-15 BC"]),
        (("t", "timestamp without time zone", "timestamp", -1, None), ["2024-01-02 03:04:05.123456", "-infinity"]),
        (("z", "timestamp with time zone", "timestamptz", -1, None), ["2024-01-01 21:34:05.5+00", None]),
        (("b", "boolean", "bool", -1, None), ["t", "f", None]),
        (("x", "bytea", "bytea", -1, None), ["\\x00ff", "\\x"]),
        (("a", "integer[]", "_int4", -1, "int4"), ["{1,NULL,3}", "{{1,2},{3,4}}"]),
    ]
    for spec, texts in cases:
        col = make_column(*spec)
        schema = TableSchema("public.t", (col,), ())
        enc = value_encoder(col)
        rows = pa.chunked_array([pa.array(["{}" if v is None else '{"' + col.name + '":' + enc(v) + "}" for v in texts])])
        want = decode_rows(rows, schema).column(0).to_pylist()
        got = packed_rows.typed_column(pa.array(texts, pa.string()), col).to_pylist()
        assert json.dumps(got, default=str) == json.dumps(want, default=str), spec


def test_a_packed_chunk_holds_what_the_json_chunk_decodes_to(pg_url: str) -> None:
    """A snapshot chunk of a table with a column of every kind (test_rows: NaN, infinities, BC, arrays, bytea,
    domains, enums), read as ``::text`` and typed, against the server's JSON rows decoded."""
    from flinkish_spark.connectors.postgres.connection import parse_url
    from flinkish_spark.connectors.postgres.rows import split_tables
    from flinkish_spark.connectors.postgres.source.tables_reader import chunk_connection, read_chunk
    from tests.connectors.postgres.test_rows import ROWS, make_table, session

    with session(pg_url) as conn:
        schema = make_table(conn)
        conn.execute("INSERT INTO everything VALUES " + ", ".join(ROWS))
        oid = conn.execute("SELECT 'everything'::regclass::oid").fetchone()[0]  # type: ignore[index]
    chunk = {"table": schema.table, "oid": oid, "column": "id", "type": "bigint", "lo": None, "hi": None}
    got = {}
    for fmt in ("json", "arrow"):
        src = SimpleNamespace(conn_info=parse_url(pg_url), component="test", row_format=fmt)
        conn = chunk_connection(src)
        try:
            read = read_chunk(src, chunk, conn)
            batches = list(Packer().pack_all(read)) if fmt == "arrow" else list(read)
        finally:
            conn.close()
        if fmt == "arrow":
            assert all(is_packed(b.schema.names) for b in batches)
            decode = PackedDecode()
            for b in batches:
                decode.add(b)
            rows = decode.result()[schema.table][1]
        else:
            rows = split_tables(pa.Table.from_batches(batches))[schema.table].rows
        got[fmt] = json.dumps(rows.sort_by("id").to_pylist(), default=str)
    a, j = json.loads(got["arrow"]), json.loads(got["json"])
    for ra, rj in zip(a, j):
        for k in rj:
            assert json.dumps(ra[k]) == json.dumps(rj[k]), (k, ra[k], rj[k])
    assert got["arrow"] == got["json"]
    assert "2024-01-01 21:34:05.123456+00:00" in got["arrow"]  # timestamptz typed, in UTC


def test_w_packs_unpack_to_the_json_rows_p_packs_unpack_to(small_runs: None) -> None:
    """A sink that reads JSON rows (the PostgreSQL routed sink's staging, ``unpack_json``) gets from w packs the
    rows it gets from the same changes packed and typed in the source."""
    from flinkish_spark.connectors.postgres.rows.packed import unpack_json

    s = _many_tables_stream(6, txns=120)
    relations = relations_in(s.messages)
    src = SimpleNamespace(component="test", slot_name="s", decode_in="sink")

    def resolve(rel: Relation) -> TableSchema | None:
        return s.schemas[(rel.relid, rel.names)]

    wire = list(packed_rows.packed_pieces(src, [s.messages], 0, 1 << 62, relations, resolve))
    assert {op for b in wire for op in b.column("_op").to_pylist()} == {"s", "w"}
    typed = list(Packer().pack_all(stream_pieces(src, [s.messages], 0, 1 << 62, relations, resolve)))
    key = lambda r: (r["_table"], r["_lsn"], r["_seq"])  # noqa: E731
    want = sorted(unpack_json(pa.Table.from_batches(typed)).to_pylist(), key=key)
    got = sorted(unpack_json(pa.Table.from_batches(wire)).to_pylist(), key=key)
    assert len(got) == len(want) > 300 and got == want


def test_a_piece_of_only_a_skipped_table_keeps_the_transactions_seq(small_runs: None) -> None:
    """A piece cut inside a transaction whose only change is of a table not followed: the _seq of the followed
    table's next change (in the next piece) counts on from before, as the per-message path counts."""
    s = Stream()
    s.relation(1, "public.t1", COLUMNS[:2])
    s.relation(3, "other.skip", COLUMNS[:2], followed=False)
    s.txn([insert(1, ["1", "a"]), insert(1, ["2", "b"]), insert(3, ["3", "c"]), insert(1, ["4", "d"])])
    relations = relations_in(s.messages)
    src = SimpleNamespace(component="test", slot_name="s", decode_in="sink")

    def resolve(rel: Relation) -> TableSchema | None:
        return s.schemas[(rel.relid, rel.names)]

    pieces = [s.messages[:5], s.messages[5:6], s.messages[6:]]  # [R, R, B, I, I], [I of the skipped table], [I, C]
    assert [m[:1] for m in pieces[1]] == [b"I"]
    batches = list(packed_rows.packed_pieces(src, pieces, 0, 1 << 62, relations, resolve))
    assert {op for b in batches for op in b.column("_op").to_pylist()} == {"s", "w"}
    decode = PackedDecode()
    for b in batches:
        decode.add(b)
    rows = decode.result()["public.t1"][1]
    assert rows.column("_seq").to_pylist() == [1, 2, 3]  # 0 is the 's' row's


@pytest.mark.parametrize("seed", range(12))
def test_w_packs_equal_the_json_way_for_random_streams_cut_at_random(small_runs: None, seed: int) -> None:
    """Many tables (one not followed, one of identity FULL), now and then a piece that does not qualify: pieces
    cut at random (~3 or ~20 messages), ranges starting and ending mid-stream -- the same tables as the JSON way."""
    r = random.Random(seed)
    s = _many_tables_stream(100 + seed, tables=6, txns=80)
    n = len(s.messages)
    cuts = sorted(r.sample(range(1, n), n // (3 if seed % 3 else 20)))  # pieces of ~3 messages, or ~20
    lsns = sorted({struct.unpack(">q", m[1:9])[0] for m in s.messages if m[:1] == b"B"})
    start, end = (0, 1 << 62) if seed % 2 else (lsns[r.randrange(5)], lsns[-1 - r.randrange(5)])
    ops: set[str] = set()
    want = tables(s, packed=False, start=start, end=end, cuts=cuts)
    got = tables(s, packed=True, start=start, end=end, decode_in="sink", ops=ops, cuts=cuts)
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], (name, start, end)
    assert "w" in ops
