"""The packed shape's typed path (``rowFormat=arrow``, :mod:`flinkish_spark.connectors.postgres.source.packed_rows`)
gives a sink the tables the JSON shape gives it: the streams of ``test_source_stream_bulk`` (every encoding, NaN and
infinities, bytea, arrays, TOAST-unchanged values, old keys, FULL identity, a keyless table, a column added midway,
a truncate, a table not followed), decoded once the JSON way and packed after, once typed from the messages."""

from __future__ import annotations

import json
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
from tests.connectors.postgres.test_source_stream_bulk import Stream, _mixed_stream, small_runs  # noqa: F401


def tables(s: Stream, packed: bool, start: int = 0, end: int = 1 << 62) -> dict[str, Any]:
    relations = relations_in(s.messages)

    def resolve(rel: Relation) -> TableSchema | None:
        return s.schemas[(rel.relid, rel.names)]

    src = SimpleNamespace(component="test", slot_name="s")
    pieces = [s.messages[i:i + 97] for i in range(0, len(s.messages), 97)]  # cut anywhere, as peeks are
    if packed:
        batches = list(packed_rows.packed_pieces(src, pieces, start, end, relations, resolve))
    else:
        batches = list(Packer().pack_all(stream_pieces(src, pieces, start, end, relations, resolve)))
    assert all(is_packed(b.schema.names) for b in batches)
    decode = PackedDecode()
    for b in batches:
        decode.add(b)
    return {name: (json.dumps(joined.to_pylist(), default=str), [x.schema_id for x in rows.schemas], figures, earlier)
            for name, (rows, joined, figures, earlier) in decode.result().items()}


@pytest.mark.parametrize("seed", [1, 2])
def test_typed_packs_hold_what_the_json_rows_decode_to(small_runs: None, seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    typed = []
    run = packed_rows._PackedStream._typed_run

    def counted(self: Any, *a: Any) -> Any:
        out = run(self, *a)
        typed.append(out is not None and out.num_rows > 0)
        return out

    monkeypatch.setattr(packed_rows._PackedStream, "_typed_run", counted)
    s = _mixed_stream(seed)
    want, got = tables(s, packed=False), tables(s, packed=True)
    assert sorted(got) == sorted(want) == ["public.full", "public.nokey", "public.wide"]
    for name in want:
        assert got[name] == want[name], name
    assert sum(typed) >= 5  # the long runs of inserts went the typed way


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
