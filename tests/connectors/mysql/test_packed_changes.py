"""A MySQL change range packed straight from the decoded values (``rowFormat=arrow``, connectors/mysql/packed_changes.py)
holds exactly what the JSON way's packs hold (each change as JSON, packed by the Packer): per table the same schema
rows and the same typed rows in the same order (``read_pack``), the same JSON rows back (``unpack_json``) -- for a
range of inserts, updates with NULLs, key moves, deletes, an ADD COLUMN mid-range, two tables interleaved in one
transaction, a truncate, and a table of every MySQL type."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from flinkish_spark.connectors.cdc.patterns import TablePatterns
from flinkish_spark.connectors.mysql.connection import parse_url
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from flinkish_spark.connectors.mysql import packed_changes
from flinkish_spark.connectors.mysql.packed_changes import typed_values
from flinkish_spark.connectors.mysql.stream_rows import column
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.rows.packed import PACKED_ARROW, Packer, read_pack, unpack_json
from tests.connectors.mysql.test_packed_chunks import _table


def _read(dialect: MysqlDialect, start: int, end: int, packed: bool, row_images: bool = True) -> pa.Table:
    dialect.packed_chunks, dialect.row_images = packed, row_images
    batches = list(Packer().pack_all(dialect.read_changes(start, end, None)))  # the reader's Packer, as the source
    return pa.Table.from_batches(batches, schema=PACKED_ARROW)


def _per_table(stream: pa.Table) -> dict[str, list[Any]]:
    """Per table: its schema rows (as they are) and data rows (from the packs), in stream order."""
    out: dict[str, list[Any]] = {}
    heads = stream.select([n for n in PACKED_ARROW.names if n != "batch"]).to_pylist()
    for head, blob in zip(heads, stream.column("batch").to_pylist()):
        rows = out.setdefault(head["_table"], [])
        if head["_op"] == "s":
            rows.append(("s", head["_schema_id"], head["_lsn"], head["_seq"], head["_commit_ts"], blob))
            continue
        pack = read_pack(blob)
        rows.append(("schema", head["_schema_id"], pack.schema))
        got = pack.to_pylist()
        assert (head["_lsn"], head["_seq"], head["_last_lsn"]) == (got[0]["_lsn"], got[0]["_seq"], got[-1]["_lsn"])
        assert head["_count"] == sum(r["_op"] != "t" for r in got) and head["_changes"] == len(got)
        assert head["_commit_ts"] == max(r["_commit_ts"] for r in got)
        rows.extend(("row", head["_schema_id"], r) for r in got)
    # the JSON way cuts packs where the source's batches end, the direct way where its runs end: compare rows
    return {t: [r for i, r in enumerate(rows) if r[0] != "schema" or r not in rows[:i]] for t, rows in out.items()}


def test_a_change_range_packed_from_decoded_values_is_the_json_ways_pack(mariadb: Any, mysql_db: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    db = mysql_db
    by_json: list[str] = []  # the columns that went the JSON way
    original = packed_changes.by_json

    def noted(values: Any, col: Any) -> pa.Array:
        by_json.append(col.name)
        return original(values, col)

    monkeypatch.setattr(packed_changes, "by_json", noted)
    mariadb.sql("CREATE TABLE t (id int PRIMARY KEY, name varchar(20), v decimal(9,2), ts datetime(6)); "
                "CREATE TABLE u (k varchar(10) PRIMARY KEY, x int)", database=db)
    info = parse_url(mariadb.url_for(db))
    dialect = MysqlDialect(info, patterns=TablePatterns.parse(f"{db}.*", "t"))
    with dialect.connect() as conn:
        start = dialect.current_position(conn)
    names = _table(mariadb, db)  # every type: three rows, the second the other ends, the third all NULL
    mariadb.sql(
        "INSERT INTO t SELECT seq, concat('n', seq), seq / 7, '2024-01-01' + INTERVAL seq SECOND FROM seq_1_to_300; "
        "BEGIN; UPDATE t SET name = NULL WHERE id < 50; UPDATE t SET id = id + 1000 WHERE id BETWEEN 50 AND 60; "
        "INSERT INTO u VALUES ('a', 1), ('b', NULL); UPDATE t SET v = NULL WHERE id = 70; "
        "DELETE FROM t WHERE id > 290; INSERT INTO u VALUES ('z', 3); COMMIT; "
        "ALTER TABLE t ADD COLUMN extra int; UPDATE t SET extra = 5 WHERE id < 10; UPDATE u SET k = 'c' WHERE k = 'a'; "
        f"UPDATE a SET {names[0]} = NULL, f = 1.5 WHERE id = 1; DELETE FROM a WHERE id = 2; "
        "TRUNCATE TABLE u; INSERT INTO u VALUES ('d', 4); DELETE FROM t WHERE id = 5", database=db)
    end = dialect.change_target(start, None)
    today, direct = _read(dialect, start, end, False), _read(dialect, start, end, True)
    assert set(by_json) == {"d65"}  # DECIMAL(65,30): Decimals into text; every other type typed directly
    want, got = _per_table(today), _per_table(direct)
    assert set(got) == {f"{db}.a", f"{db}.t", f"{db}.u"}
    for table in want:
        assert got[table] == want[table], table
    ops = {t: [r[2]["_op"] for r in rows if r[0] == "row"] for t, rows in got.items()}
    assert "t" in ops[f"{db}.u"] and ops[f"{db}.u"][-1] == "c"
    assert [r[0] for r in got[f"{db}.t"]].count("s") == 2  # the ADD COLUMN: a second schema row mid-range
    assert ops[f"{db}.t"].count("d") == 11 + 10 + 11 + 1  # the key moves; id > 290 (the moved keys too); id 5
    assert ops[f"{db}.a"] == ["c", "c", "c", "u", "d"]
    key = lambda r: (r["_table"], r["_lsn"] or 0, r["_seq"] or 0)  # noqa: E731 - tables are not ordered between them
    assert sorted(unpack_json(direct).to_pylist(), key=key) == sorted(unpack_json(today).to_pylist(), key=key)
    # the JSON rows of the direct packs are the rows of the source's JSON shape
    dialect.packed_chunks = False
    json_rows = [r for b in dialect.read_changes(start, end, None) for r in b.to_pylist() if r["_op"] != "s"]
    unpacked = [r for r in unpack_json(direct).to_pylist() if r["_op"] != "s"]
    assert len(unpacked) == len(json_rows)


def test_a_column_whose_values_arrow_would_take_otherwise_goes_the_json_way() -> None:
    wide = column("d", "decimal(65,30)")  # a text column of Decimals
    text = column("s", "varchar(5)")
    assert typed_values([Decimal("1.50"), None], wide, pa.string()).to_pylist() == ["1.50", None]
    assert typed_values([b"ok\xff", "x"], text, pa.string()).to_pylist() == ["ok\ufffd", "x"]
    assert typed_values([True, None], column("n", "int"), pa.int32()).to_pylist() == [1, None]


def test_a_wide_tables_rows_are_flushed_before_they_hold_too_many_values() -> None:
    schema = TableSchema("d.w", tuple(column(f"c{i}", "int") for i in range(512)), ("c0",))
    rows = packed_changes.PackedRows()
    rows.add_schema(schema, 1, 0, 0)
    n = 0
    while not rows.full():
        rows.add(schema.table, "c", 1, n + 1, 0, schema.schema_id, [n] * 512)
        n += 1
    assert n == packed_changes.FLUSH_VALUES // 512  # not PACK_ROWS (65,536) rows of 512 values each
    batch = rows.flush().to_pylist()
    assert [r["_op"] for r in batch] == ["s", "p"] and batch[1]["_count"] == n and not rows.full()
    assert read_pack(batch[1]["batch"]).column("c511").to_pylist() == list(range(n))
