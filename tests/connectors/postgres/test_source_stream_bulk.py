"""The bulk decode of the change stream gives the rows of the per-message path, byte for byte, batch for batch.

Streams of pgoutput messages are built here (no server): every encoding the row encoder has (numbers with
NaN and infinities, bools, text with quotes, backslashes, control characters and non-ASCII, timestamps, jsonb,
bytea, arrays), nulls, unchanged TOASTed values, updates with and without an old key, REPLICA IDENTITY FULL,
deletes, several tables interleaved, a Relation message that changes the columns midway, a truncate, a table
that is not followed, a range that starts and ends mid-stream, bytes that are not UTF-8 and truncated
messages. ``stream_batches(bulk=False)`` is the per-message path, the one ``test_source_stream_rows`` pins
to recorded rows; the bulk path must not differ from it in any row, any batch boundary or any error.
"""

from __future__ import annotations

import random
import struct
from types import SimpleNamespace
from typing import Any, Iterator

import pyarrow as pa
import pytest

from flinkish_spark.connectors.postgres.pgoutput import Relation, relations_in
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.rows.schema import make_column
from flinkish_spark.connectors.postgres.source import stream_rows
from flinkish_spark.connectors.postgres.source.stream_rows import stream_batches

# (name, type display, pg_type, typmod, element type, value maker)
TEXTS = ["plain", 'a "quoted" word', "back\\slash", "line\nbreak\ttab\rcr", "bell\x07 and \x1f unit", "\b\f",
         "ünïcødé ✓ 😀", "", "{\"k\": 1, \"color\": \"red\"}", "trailing \\"]
COLUMNS: list[tuple[str, str, str, int, str | None, Any]] = [
    ("id", "integer", "int4", -1, None, None),
    ("name", "text", "text", -1, None, lambda r: r.choice(TEXTS) + str(r.randint(0, 9))),
    ("amount", "numeric(12,2)", "numeric", (12 << 16 | 2) + 4, None, lambda r: r.choice(["1.50", "-0.01", "NaN"])),
    ("f", "double precision", "float8", -1, None, lambda r: r.choice(["1.25", "Infinity", "-Infinity", "1e-07"])),
    ("ts", "timestamp with time zone", "timestamptz", -1, None, lambda r: "2024-01-01 00:00:01.5+00"),
    ("ok", "boolean", "bool", -1, None, lambda r: r.choice("tf")),
    ("attrs", "jsonb", "jsonb", -1, None, lambda r: '{"a": [1, "x\\"y"]}'),
    ("raw", "bytea", "bytea", -1, None, lambda r: "\\x" + bytes(r.randrange(256) for _ in range(3)).hex()),
    ("nums", "integer[]", "_int4", -1, "int4", lambda r: "{1,NULL,3}"),
    ("tags", "text[]", "_text", -1, "text", lambda r: '{a,"b c","d\\"e"}'),
    ("big", "numeric", "numeric", -1, None, lambda r: "123456789012345678901234567890123456789.5"),
]


def _tuple(values: list[Any]) -> bytes:
    out = struct.pack(">h", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v == "u":
            out += b"u"
        else:
            raw = v if isinstance(v, bytes) else v.encode()
            out += b"t" + struct.pack(">i", len(raw)) + raw
    return out


class Stream:
    """pgoutput messages, as a peek returns them."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.lsn = 1000
        self.schemas: dict[tuple[int, tuple[str, ...]], TableSchema | None] = {}

    def relation(self, relid: int, table: str, cols: list[tuple[str, str, str, int, str | None, Any]],
                 key: tuple[str, ...] = ("id",), identity: str = "d", followed: bool = True) -> None:
        ns, name = table.split(".")
        body = b"R" + struct.pack(">I", relid) + ns.encode() + b"\0" + name.encode() + b"\0" + identity.encode()
        body += struct.pack(">h", len(cols))
        for c in cols:
            body += bytes([1 if (c[0] in key or identity == "f") else 0]) + c[0].encode() + b"\0" + struct.pack(">Ii", 25, c[3])
        self.messages.append(body)
        schema = TableSchema(table, tuple(make_column(*c[:5]) for c in cols), key)
        self.schemas[(relid, tuple(c[0] for c in cols))] = schema if followed else None

    def txn(self, changes: list[bytes]) -> None:
        self.lsn += 100
        self.messages.append(b"B" + struct.pack(">qqI", self.lsn, 7_000_000 + self.lsn, 1))
        self.messages.extend(changes)
        self.messages.append(b"C\0" + struct.pack(">qqq", self.lsn, self.lsn + 8, 7_000_000 + self.lsn))

    def rows(self, start: int = 0, end: int = 1 << 62, bulk: bool = True) -> list[pa.RecordBatch]:
        relations = relations_in(self.messages)

        def resolve(rel: Relation) -> TableSchema | None:
            return self.schemas[(rel.relid, rel.names)]

        src = SimpleNamespace(component="test", slot_name="s")
        return list(stream_batches(src, self.messages, start, end, relations, resolve, bulk=bulk))


def insert(relid: int, values: list[Any]) -> bytes:
    return b"I" + struct.pack(">I", relid) + b"N" + _tuple(values)


def update(relid: int, values: list[Any], old: list[Any] | None = None, old_tag: bytes = b"K") -> bytes:
    head = b"U" + struct.pack(">I", relid)
    return head + (b"" if old is None else old_tag + _tuple(old)) + b"N" + _tuple(values)


def delete(relid: int, old: list[Any], tag: bytes = b"K") -> bytes:
    return b"D" + struct.pack(">I", relid) + tag + _tuple(old)


def _row(r: random.Random, i: int, cols: list[Any]) -> list[Any]:
    return [str(i)] + [None if r.random() < 0.1 else c[5](r) for c in cols[1:]]


def assert_same(stream: Stream, **kw: Any) -> list[pa.RecordBatch]:
    bulk, per_message = stream.rows(bulk=True, **kw), stream.rows(bulk=False, **kw)
    assert [b.num_rows for b in bulk] == [b.num_rows for b in per_message]
    for b, p in zip(bulk, per_message):
        assert b.schema == p.schema
        for name in p.schema.names:
            assert b.column(name).to_pylist() == p.column(name).to_pylist(), name
    return bulk


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_rows, "MIN_BULK_ROWS", 4)
    monkeypatch.setattr(stream_rows, "BATCH_ROWS", 50)


def _mixed_stream(seed: int) -> Stream:
    r = random.Random(seed)
    s = Stream()
    wide = COLUMNS
    s.relation(1, "public.wide", wide)
    s.relation(2, "public.full", COLUMNS[:3], identity="f", key=("id", "name", "amount"))
    s.relation(3, "public.nokey", COLUMNS[:2], key=())
    s.relation(4, "other.skip", COLUMNS[:2], followed=False)
    n = 0
    for t in range(12):
        changes = []
        if t == 6:
            # the table gains a column midway (a new Relation message, inside the transaction as the server sends it)
            wide = COLUMNS + [("extra", "text", "text", -1, None, lambda r: "e")]
            s.relation(1, "public.wide", wide)
            changes.append(s.messages.pop())
        for _ in range(r.randint(1, 40)):
            n += 1
            p = r.random()
            if p < 0.55:
                changes.append(insert(1, _row(r, n, wide)))
            elif p < 0.65:
                changes.append(update(1, _row(r, n, wide)))
            elif p < 0.7:
                changes.append(update(1, _row(r, n, wide), old=[str(n - 1)] + [None] * (len(wide) - 1)))
            elif p < 0.75:
                changes.append(delete(1, [str(n)] + [None] * (len(wide) - 1)))
            elif p < 0.8:
                changes.append(update(1, [v if i % 3 else "u" for i, v in enumerate(_row(r, n, wide))]))
            elif p < 0.85:
                old = _row(r, n, COLUMNS[:3])
                changes.append(update(2, _row(r, n, COLUMNS[:3]), old=old, old_tag=b"O"))
            elif p < 0.9:
                changes.append(insert(3, _row(r, n, COLUMNS[:2])))
            elif p < 0.93:
                changes.append(delete(3, _row(r, n, COLUMNS[:2]), tag=b"O"))
            else:
                changes.append(insert(4, _row(r, n, COLUMNS[:2])))
        if t == 6:
            changes.append(b"T" + struct.pack(">iB", 1, 0) + struct.pack(">I", 3))
        s.txn(changes)
        # long runs of plain inserts, the bulk path's case
        s.txn([insert(1, _row(r, n + i, wide)) for i in range(r.randint(5, 120))])
        n += 200
    return s


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_bulk_and_per_message_rows_are_the_same(small_runs: None, seed: int) -> None:
    s = _mixed_stream(seed)
    batches = assert_same(s)
    rows = [r for b in batches for r in b.to_pylist()]
    assert {r["_op"] for r in rows} == {"s", "c", "u", "d", "t"}
    assert any('\\"quoted\\"' in (r["row"] or "") for r in rows) and any("\\u0007" in (r["row"] or "") for r in rows)


def test_a_range_that_starts_and_ends_mid_stream(small_runs: None) -> None:
    s = _mixed_stream(4)
    lsns = sorted({struct.unpack(">q", m[1:9])[0] for m in s.messages if m[:1] == b"B"})
    assert_same(s, start=lsns[3], end=lsns[-4])


def test_plain_inserts_go_in_bulk_and_batches_cut_where_they_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mirror's common case at its real batch size: one table, 1,000-row transactions."""
    r = random.Random(5)
    s = Stream()
    s.relation(1, "bench.t", COLUMNS)
    for t in range(3):
        s.txn([insert(1, _row(r, t * 1000 + i, COLUMNS)) for i in range(1000)])
    monkeypatch.setattr(stream_rows, "BATCH_ROWS", 1_200)
    calls: list[int] = []
    real = stream_rows.bulk_rows.rows_json

    def counted(*a: Any) -> pa.Array:
        calls.append(len(a[1]))
        return real(*a)

    monkeypatch.setattr(stream_rows.bulk_rows, "rows_json", counted)
    batches = assert_same(s)
    assert [b.num_rows for b in batches] == [1_200, 1_200, 601] and sum(calls) == 2_999  # all but the first row


def _broken(messages: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    at = next(i for i, m in enumerate(messages) if m[:1] == b"I" and i > 40)
    yield "not UTF-8", messages[:at] + [messages[at].replace(b"plain", b"pl\xffin")] + messages[at + 1:]
    yield "truncated", messages[:at] + [messages[at][:-3]] + messages[at + 1:]
    yield "binary", messages[:at] + [messages[at][:15] + b"b" + messages[at][16:]] + messages[at + 1:]


def test_what_the_bulk_path_declines_fails_as_the_per_message_path_does(small_runs: None) -> None:
    s = Stream()
    s.relation(1, "public.t", COLUMNS[:2])
    s.txn([insert(1, ["1", "plain"])] + [insert(1, [str(i), "plain"]) for i in range(2, 60)])
    base = s.messages
    for what, messages in _broken(base):
        s.messages = messages
        errors: list[tuple[type, str] | None] = []
        for bulk in (True, False):
            try:
                s.rows(bulk=bulk)
                errors.append(None)
            except Exception as e:  # the same type and text either way
                errors.append((type(e), str(e)))
        assert errors[0] == errors[1] and errors[0] is not None, what


def test_the_sink_decodes_arrow_rows_as_it_decodes_their_texts(small_runs: None) -> None:
    """``decode_rows`` joins Arrow rows to JSON lines without a Python string per row, and looks for the unchanged
    columns' field in their bytes: sliced chunks, several chunks and null rows decode as their texts do."""
    from flinkish_spark.connectors.postgres.rows.decode import _unchanged, decode_rows

    s = _mixed_stream(7)
    rows = pa.Table.from_batches(s.rows())
    schema = next(v for v in s.schemas.values() if v is not None and v.table == "public.wide" and len(v.columns) > 11)
    mine = rows.filter(pa.compute.equal(rows.column("_schema_id"), schema.schema_id)).column("row")
    pieces = pa.chunked_array([mine.combine_chunks().slice(3, 40), pa.array([None], pa.string()),
                               mine.combine_chunks().slice(50)])
    texts = ["{}" if t is None else t for t in pieces.to_pylist()]
    assert repr(decode_rows(pieces, schema).to_pylist()) == repr(decode_rows(texts, schema).to_pylist())
    listed = _unchanged(pieces).to_pylist()
    assert any(listed) and listed == [None if t is None or "unchanged" not in t else listed[i]
                                      for i, t in enumerate(pieces.to_pylist())]


def test_a_sinks_task_decodes_its_batches_as_they_come_into_what_split_tables_gives() -> None:
    """``IncrementalSplit`` (what a routing sink's task uses): a one-table task in stream order is decoded batch by
    batch, anything else -- several tables, a schema change, rows out of order -- falls back to ``split_tables``;
    either way the tables are ``split_tables``' to the last value."""
    from flinkish_spark.connectors.postgres.rows import split_tables
    from flinkish_spark.connectors.postgres.rows.split_stream import IncrementalSplit

    r = random.Random(8)
    one = Stream()
    one.relation(1, "bench.t", COLUMNS)
    for t in range(4):
        one.txn([insert(1, _row(r, t * 100 + i, COLUMNS)) for i in range(100)]
                + [update(1, [v if i % 4 else "u" for i, v in enumerate(_row(r, t, COLUMNS))])])
    mixed = _mixed_stream(9)

    def both(batches: list[pa.RecordBatch]) -> tuple[bool, str, str]:
        split = IncrementalSplit()
        for b in batches:
            split.add(b)
        stream = pa.Table.from_batches(batches)
        got, want = split.result(stream), split_tables(stream)
        show = lambda d: repr({t: (v.schemas, v.rows.to_pylist()) for t, v in d.items()})  # noqa: E731  (NaN)
        return split.fits, show(got), show(want)

    batches = one.rows()
    rows = pa.Table.from_batches(batches)
    fits, got, want = both([b for c in (rows.slice(0, 7), rows.slice(7, 250), rows.slice(257)) for b in c.to_batches()])
    assert fits and got == want
    shuffled = rows.take(pa.array(random.Random(1).sample(range(rows.num_rows), rows.num_rows)))
    fits, got, want = both(shuffled.to_batches(max_chunksize=100))
    assert not fits and got == want
    fits, got, want = both(pa.Table.from_batches(mixed.rows()).to_batches(max_chunksize=64))
    assert not fits and got == want


def _pieces(s: Stream, cuts: list[int], start: int = 0, end: int = 1 << 62) -> list[pa.RecordBatch]:
    """The stream's batches read as ``peek_pieces`` hands it over: the messages cut at ``cuts``."""
    from flinkish_spark.connectors.postgres.source.stream_rows import stream_pieces

    bounds = [0, *cuts, len(s.messages)]
    relations = relations_in(s.messages)
    src = SimpleNamespace(component="test", slot_name="s")
    return list(stream_pieces(src, (s.messages[a:b] for a, b in zip(bounds[:-1], bounds[1:])), start, end,
                              relations, lambda rel: s.schemas[(rel.relid, rel.names)]))


def _same_batches(got: list[pa.RecordBatch], want: list[pa.RecordBatch], where: object) -> None:
    assert [b.num_rows for b in got] == [b.num_rows for b in want], where
    assert [b.to_pylist() for b in got] == [b.to_pylist() for b in want], where


def test_a_stream_cut_into_pieces_anywhere_gives_the_batches_of_one_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader takes a WAL range piece by piece (``peek_pieces``): a piece may end inside a transaction, inside
    a run of one table's rows the bulk path takes, between a Relation message and its rows, before a truncate --
    the batches (rows and boundaries) are those of the whole range as one list, at every cut and piece size."""
    monkeypatch.setattr(stream_rows, "MIN_BULK_ROWS", 3)
    monkeypatch.setattr(stream_rows, "BATCH_ROWS", 7)
    bulk_calls: list[int] = []
    rows_json = stream_rows.bulk_rows.rows_json

    def counted(*a: Any) -> pa.Array:
        bulk_calls.append(1)
        return rows_json(*a)

    monkeypatch.setattr(stream_rows.bulk_rows, "rows_json", counted)
    r = random.Random(5)
    s = Stream()
    s.relation(1, "public.wide", COLUMNS[:4])
    s.relation(3, "public.nokey", COLUMNS[:2], key=())
    s.txn([insert(1, _row(r, i, COLUMNS[:4])) for i in range(9)] + [insert(3, _row(r, 50, COLUMNS[:2]))])
    wider = COLUMNS[:5]
    s.relation(1, "public.wide", wider)
    relation = s.messages.pop()
    s.txn([relation] + [insert(1, _row(r, 100 + i, wider)) for i in range(5)]
          + [delete(1, ["3"] + [None] * 4), update(1, [v if i % 2 else "u" for i, v in enumerate(_row(r, 7, wider))])]
          + [b"T" + struct.pack(">iB", 1, 0) + struct.pack(">I", 3)])
    s.txn([insert(1, _row(r, 200 + i, wider)) for i in range(6)])
    one = s.rows()
    _same_batches(one, s.rows(bulk=False), "the per-message path")
    assert bulk_calls
    n = len(s.messages)
    for cut in range(n + 1):
        _same_batches(_pieces(s, [cut]), one, cut)
    for size in (1, 2, 3, 5):
        _same_batches(_pieces(s, list(range(size, n, size))), one, size)
        for offset in range(1, size):
            _same_batches(_pieces(s, list(range(offset, n, size))), one, (offset, size))
    # a bigger mixed stream, and a range that starts and ends mid-stream
    m = _mixed_stream(6)
    lsns = sorted({struct.unpack(">q", x[1:9])[0] for x in m.messages if x[:1] == b"B"})
    for start, end in ((0, 1 << 62), (lsns[2], lsns[-3])):
        want = m.rows(start, end)
        for size in (1, 13, 100):
            _same_batches(_pieces(m, list(range(size, len(m.messages), size)), start, end), want, (start, size))
