"""The change rows of the multi-table stream are the same, byte for byte, as the day they were recorded.

``stream_rows_pg18.json`` holds the pgoutput messages a PostgreSQL 18 server sent for the scenario of
:mod:`stream_fixture` (every column kind with NULLs, NaN, infinities, BC dates, arrays and bytea; updates, a
key change, deletes; unchanged TOASTed values under default and FULL identity; a column added mid-stream; a
truncate; a table the patterns leave out) and the stream rows the reader made of them then. A decoder made
faster must give every row again: a target fed by either cannot tell them apart. No server needed.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flinkish_spark.connectors.postgres.pgoutput import Relation, relations_in
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.source import stream_rows
from flinkish_spark.connectors.postgres.source.tables_reader import stream_batches

FIXTURE = Path(__file__).with_name("stream_rows_pg18.json")


def replay(start: int = 0, end: int = 1 << 63) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    recorded = json.loads(FIXTURE.read_text())
    messages = [bytes.fromhex(m) for m in recorded["messages"]]
    schemas = {(r["relid"], tuple(r["columns"])): r["schema"] for r in recorded["resolved"]}
    relations = relations_in(messages)

    def resolve(rel: Relation) -> TableSchema | None:
        text = schemas[(rel.relid, tuple(c.name for c in rel.columns))]
        return None if text is None else TableSchema.from_json(text)

    src = SimpleNamespace(component="test", slot_name="fixture")
    got = [r for b in stream_batches(src, messages, start, end, relations, resolve) for r in b.to_pylist()]
    for r in got:
        assert r["_commit_ts"] is None or isinstance(r["_commit_ts"], datetime)
        r["_commit_ts"] = None if r["_commit_ts"] is None else r["_commit_ts"].isoformat()
    return got, recorded["rows"]


@pytest.mark.parametrize("min_bulk_rows", [None, 1])
def test_every_change_row_is_the_recorded_one(monkeypatch: pytest.MonkeyPatch, min_bulk_rows: int | None) -> None:
    """Also with every stretch of plain row messages through the bulk decode (``stream_rows.MIN_BULK_ROWS``)."""
    if min_bulk_rows is not None:
        monkeypatch.setattr(stream_rows, "MIN_BULK_ROWS", min_bulk_rows)
    got, want = replay()
    assert len(got) == len(want) == 28
    for g, w in zip(got, want):
        assert g == w
    ops = "".join(r["_op"] for r in got)
    assert ops == "scccudud" "sccc" "uu" "sccdudud" "sccu" "t" "c"


def test_a_range_gives_the_recorded_rows_of_its_transactions() -> None:
    _, want = replay()
    lsns = sorted({r["_lsn"] for r in want})
    got, _ = replay(lsns[2], lsns[5])
    # Its first row of a table is an 's' row again (a range is self-describing: the _seq after it moves by one), the
    # data rows are the recorded ones.
    def data(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "_seq"} for r in rows if r["_op"] != "s"]

    assert data(got) == data([r for r in want if lsns[2] <= r["_lsn"] < lsns[5]])
    assert {r["_table"] for r in got if r["_op"] == "s"} == {r["_table"] for r in got}


def test_split_tables_gives_each_table_the_same_rows_alone_mixed_or_out_of_order() -> None:
    """A sink's task sees one table alone (a one-table mirror), several, or rows not in stream order: the
    typed rows of a table are the same (the fast paths -- no filter for one table, no take for rows in order
    or of one schema -- against the general ones; ``docs`` has two schemas, a truncate and TOASTed values)."""
    import random

    import pyarrow as pa

    from flinkish_spark.connectors.postgres.rows import split_tables

    recorded = json.loads(FIXTURE.read_text())
    rows = [dict(r, _commit_ts=None if r["_commit_ts"] is None else datetime.fromisoformat(r["_commit_ts"]))
            for r in recorded["rows"]]
    schema = pa.schema([("_table", pa.string()), ("_op", pa.string()), ("_lsn", pa.int64()), ("_seq", pa.int64()),
                        ("_commit_ts", pa.timestamp("us", "UTC")), ("_schema_id", pa.string()), ("row", pa.string())])

    def split(some: list[dict[str, Any]]) -> dict[str, Any]:
        # repr: NaN is not equal to itself
        return {t: (r.schemas, repr(r.rows.to_pylist())) for t, r in split_tables(pa.Table.from_pylist(some, schema)).items()}

    mixed = split(rows)
    assert len(mixed) >= 3 and len(mixed["public.docs"][0]) == 2
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    assert split(shuffled) == mixed
    for table in mixed:
        assert split([r for r in rows if r["_table"] == table]) == {table: mixed[table]}
