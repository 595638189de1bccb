"""A MySQL snapshot chunk packed straight from its typed Arrow (``rowFormat=arrow``, connectors/mysql/packed_chunks.py)
holds exactly what the JSON way's packs hold (the chunk's rows as JSON, packed by the Packer): the same typed rows a
routed sink reads (``read_pack``), the same JSON rows back (``unpack_json``), for a table of every MySQL type."""

from __future__ import annotations

import datetime
from contextlib import closing
from typing import Any

import pyarrow as pa

from flinkish_spark.connectors.mysql.chunk_rows import read_chunk_rows
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.packed_chunks import typed_columns
from flinkish_spark.connectors.mysql.stream_rows import column
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.connectors.postgres.rows.packed import PACKED_ARROW, Packer, read_pack, unpack_json
from tests.connectors.mysql.test_snapshot import TYPES
from tests.connectors.mysql.test_types import COLUMNS

# The columns of test_types.py that test_snapshot.py's row of every type has not, with a value each.
_MORE = {"ti1": "1", "tiu": "255", "si": "-32768", "siu": "65535", "mi": "16777215", "i": "-2147483648",
         "bi": "-9223372036854775808", "d0": "9999999999", "vb": "x'00ff00'", "tx": "'tëxt ☃\\n\\t\"q\" \\\\'",
         "dt": "'1000-01-01'", "g": "PointFromText('POINT(1 2)')", "u": "'123e4567-e89b-12d3-a456-426614174000'"}
# A second row: the other ends of the ranges (the first row's value where not named).
_ENDS = {"ti": "127", "iu": "0", "biu": "0", "d": "0.01", "f": "-3.4e38", "db": "-1.7976931348623157e308",
         "c": "''", "vc": "''", "bn": "x'00'", "bl": "''", "e": "'small'", "st": "''", "b1": "b'0'", "b9": "b'0'",
         "j": "'[]'", "dz": "'2024-02-00'", "dd": "'9999-12-31'", "dtm": "'1000-01-01 00:00:00'",
         "dtz": "'0000-00-00 00:00:00'", "ts": "'1970-01-01 00:00:01'", "tm": "'838:59:59'", "y": "0",
         "bi": "9223372036854775807", "i": "2147483647", "dt": "'2024-00-00'", "u": "'00000000-0000-0000-0000-000000000000'"}


def _table(mariadb: Any, db: str) -> list[str]:
    defs = dict((d.split()[0], d) for d in list(TYPES) + list(COLUMNS))
    literals = {**{d.split()[0]: lit for d, (lit, _) in TYPES.items()}, **_MORE}
    names = list(defs)
    assert set(names) == set(literals)
    rows = [literals, {**literals, **_ENDS}, {n: "NULL" for n in names}]
    values = ", ".join(f"({i}, {', '.join(r[n] for n in names)})" for i, r in enumerate(rows, 1))
    mariadb.sql(f"CREATE TABLE a (id int PRIMARY KEY, {', '.join(defs.values())}); SET sql_mode = ''; "
                f"SET time_zone = '+00:00'; INSERT INTO a (id, {', '.join(names)}) VALUES {values}", database=db)
    return names


def _packed(mariadb: Any, db: str, direct: bool) -> pa.Table:
    chunk = {"database": db, "name": "a", "table": f"{db}.a", "lo": None, "hi": None, "resnapshot": True}
    with closing(connect(parse_url(mariadb.url_for(db)))) as conn:
        return pa.Table.from_batches(list(Packer().pack_all(read_chunk_rows(chunk, conn, direct))), schema=PACKED_ARROW)


def test_a_chunk_packed_from_typed_arrow_is_the_json_ways_pack(mariadb: Any, mysql_db: str) -> None:
    _table(mariadb, mysql_db)
    today, direct = _packed(mariadb, mysql_db, False), _packed(mariadb, mysql_db, True)
    # s, B, the rows' pack, E -- the same stream rows around the same pack
    head = [n for n in PACKED_ARROW.names if n != "batch"]
    assert direct.select(head).to_pylist() == today.select(head).to_pylist()
    assert direct.column("_op").to_pylist() == ["s", "p", "p", "p"]
    for i in range(today.num_rows):
        if today.column("_op")[i].as_py() == "s":
            assert direct.column("batch")[i] == today.column("batch")[i]
            continue
        want, got = read_pack(today.column("batch")[i].as_py()), read_pack(direct.column("batch")[i].as_py())
        assert got.schema == want.schema
        assert got.to_pylist() == want.to_pylist()
    rows = read_pack(direct.column("batch")[2].as_py()).to_pylist()
    assert [r["id"] for r in rows] == [1, 2, 3] and rows[0]["vc"] == "Zoë €" and rows[1]["dz"] is None
    assert rows[1]["bi"] == 2 ** 63 - 1 and rows[1]["dd"] == datetime.date(9999, 12, 31)
    assert all(v is None for k, v in rows[2].items() if not k.startswith("_") and k != "id")
    assert unpack_json(direct).to_pylist() == unpack_json(today).to_pylist()


def test_a_column_of_a_type_pair_not_packed_directly_goes_the_json_way() -> None:
    schema = TableSchema("d.t", (column("n", "smallint"), column("day", "date"), column("ok", "bit(1)")), ("n",))
    batch = pa.RecordBatch.from_arrays([pa.array([7, None], pa.int64()), pa.array(["2024-02-29", None]),
                                        pa.array([True, None])], names=["n", "day", "ok"])
    typed = typed_columns(schema, batch)
    assert [c.type for c in typed] == list(schema.arrow_schema().types)
    assert [c.to_pylist() for c in typed] == [[7, None], [datetime.date(2024, 2, 29), None], [True, None]]
