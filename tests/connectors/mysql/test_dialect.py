"""MariaDB as a dialect of the CDC core, its catalog and snapshot half, against the session's MariaDB: the tables the
patterns select, the chunk splits the core plans through it, each chunk read in a snapshot of its own, and the
binary log position as the core's integer."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from flinkish_spark.connectors.cdc import catalog_poll as poll
from flinkish_spark.connectors.cdc.patterns import TablePatterns, split_followable
from flinkish_spark.connectors.mysql.connection import parse_url
from flinkish_spark.connectors.mysql.changes import position_key, position_of_key
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from flinkish_spark.connectors.mysql.position import FilePosition


def test_the_core_plans_and_reads_mysql_chunks_through_the_dialect(mariadb: Any, mysql_db: str) -> None:
    mariadb.sql("CREATE TABLE orders (id int PRIMARY KEY, v varchar(10)); "
                "CREATE TABLE items (o int, n varchar(8), q decimal(9,2), PRIMARY KEY (o, n)); "
                "CREATE TABLE nokey (v int); CREATE TABLE other (id int PRIMARY KEY)", database=mysql_db)
    mariadb.sql("INSERT INTO orders SELECT seq, concat('v', seq) FROM seq_1_to_25; "
                "INSERT INTO items SELECT seq % 3, concat('n', seq), seq / 4 FROM seq_1_to_12; ANALYZE TABLE orders, items",
                database=mysql_db)
    dialect = MysqlDialect(parse_url(mariadb.url_for(mysql_db)))
    patterns = TablePatterns.parse(f"{mysql_db}.*, !{mysql_db}.other", "t")
    with dialect.connect() as conn:
        followed, left_out = split_followable(dialect.find_tables(conn, patterns))
        assert [t.table for t in followed] == ["items", "orders"]
        assert [(t.table, t.key_problem) for t in left_out] == [("nokey", "it has no primary key")]
        assert dialect.primary_keys(conn, [t.oid for t in followed]) == {followed[0].oid: ("o", "n"),
                                                                           followed[1].oid: ("id",)}
        entries, _ = poll.first_entries(dialect, conn, followed, 0, streaming=False)
        splits, planned = poll.plan_chunks(dialect, conn, entries, 0, 10)
        start = dialect.current_position(conn)
    assert planned == {0, 1}
    by_table: dict[str, list[dict[str, Any]]] = {}
    for s in splits:
        payload = json.loads(s.payload or "")
        by_table.setdefault(payload["table"], []).append(payload)
    assert [len(by_table[f"{mysql_db}.{t}"]) for t in ("items", "orders")] == [2, 3]
    assert by_table[f"{mysql_db}.items"][0]["hi"] == by_table[f"{mysql_db}.items"][1]["lo"]  # a composite bound
    mariadb.sql("INSERT INTO orders VALUES (100, 'later')", database=mysql_db)  # each chunk: its own snapshot
    conn = dialect.chunk_connection()
    try:
        orders = pa.Table.from_batches([b for p in by_table[f"{mysql_db}.orders"] for b in dialect.read_chunk_arrow(p, conn)])
        items = pa.Table.from_batches([b for p in by_table[f"{mysql_db}.items"] for b in dialect.read_chunk_arrow(p, conn)])
    finally:
        conn.close()
    assert sorted(orders.column("id").to_pylist()) == [*range(1, 26), 100] and items.num_rows == 12
    with dialect.connect() as conn:
        assert dialect.current_position(conn) > start
    text = dialect.format_position(start)
    assert dialect.parse_position(text) == start and text.endswith(f":{start & 0xFFFFFFFF}")


def test_a_binary_log_position_is_an_integer_in_file_then_offset_order() -> None:
    a, b, c = FilePosition("binlog.000009", 4), FilePosition("binlog.000009", 70000), FilePosition("binlog.000010", 4)
    assert position_key(a) < position_key(b) < position_key(c)
    assert position_of_key(position_key(b), ["binlog.000001"]) == b
