"""DDL of the binary log -> schema changes: each statement run on the real server, read back from its log and
parsed (the server writes some statements otherwise than they were sent: DROP TABLE gets a comment and quotes);
what is not classified is an 'unknown' change, never nothing."""

from __future__ import annotations

from typing import Any

from flinkish_spark.connectors.mysql import changes as C
from flinkish_spark.connectors.mysql.connection import connect, parse_url
from flinkish_spark.connectors.mysql.ddl import SchemaChange, parse
from flinkish_spark.connectors.mysql.row_values import RowDecoder
from flinkish_spark.connectors.mysql.server import collation_charsets


def _short(changes: tuple[SchemaChange, ...], db: str) -> list[tuple[Any, ...]]:
    """(kind, table, column, new name) with the database written as 'DB' when it is the test's."""
    out = []
    for c in changes:
        row: tuple[Any, ...] = (c.kind, c.table if c.database == db else f"{c.database}.{c.table}")
        if c.column or c.new_name:
            row += (c.column, c.new_name)
        if c.new_database not in (None, c.database):
            row += (c.new_database,)
        out.append(row)
    return out


# Statement -> what the log's statement parses to (tables of the test's database by their names).
CASES: list[tuple[str, list[tuple[Any, ...]] | None]] = [
    ("CREATE TABLE a (id int PRIMARY KEY, v text)", [("create_table", "a")]),
    ("CREATE TABLE IF NOT EXISTS `we``ird` (id int PRIMARY KEY)", [("create_table", "we`ird")]),
    ("CREATE TABLE b LIKE a", [("create_table", "b")]),
    ("CREATE OR REPLACE TABLE b (id int PRIMARY KEY, x int)", [("drop_table", "b"), ("create_table", "b")]),
    ("ALTER TABLE a ADD COLUMN w int NOT NULL DEFAULT 3 AFTER id", [("add_column", "a", "w", None)]),
    ("ALTER TABLE a ADD (p int, q varchar(3), INDEX iq (q))",
     [("add_column", "a", "p", None), ("add_column", "a", "q", None), ("index", "a")]),
    ("ALTER TABLE a ADD COLUMN IF NOT EXISTS /* why */ z int", [("add_column", "a", "z", None)]),
    ("ALTER TABLE a DROP COLUMN z, DROP p", [("drop_column", "a", "z", None), ("drop_column", "a", "p", None)]),
    ("ALTER TABLE a DROP COLUMN IF EXISTS nope", [("drop_column", "a", "nope", None)]),
    ("ALTER TABLE a MODIFY COLUMN w bigint", [("modify_column", "a", "w", None)]),
    ("ALTER TABLE a CHANGE w w2 bigint", [("change_column", "a", "w", "w2")]),
    ("ALTER TABLE a CHANGE COLUMN w2 w2 int", [("modify_column", "a", "w2", None)]),
    ("ALTER TABLE a RENAME COLUMN w2 TO w3", [("rename_column", "a", "w2", "w3")]),
    ("ALTER TABLE a ADD INDEX iv (v(10)), ALGORITHM=INPLACE", [("index", "a"), ("options", "a")]),
    ("ALTER TABLE a ALTER COLUMN w3 SET DEFAULT 5", [("options", "a")]),
    ("ALTER TABLE a ENGINE=InnoDB, COMMENT='c'", [("options", "a"), ("options", "a")]),
    ("ALTER TABLE a DROP PRIMARY KEY, ADD PRIMARY KEY (id, w3)", [("primary_key", "a"), ("primary_key", "a")]),
    ("ALTER TABLE a CONVERT TO CHARACTER SET latin1", [("unknown", "a")]),
    ("CREATE INDEX i2 ON a (w3)", [("index", "a")]),
    ("DROP INDEX i2 ON a", [("index", "a")]),
    ("TRUNCATE TABLE a", [("truncate", "a")]),
    ("TRUNCATE b", [("truncate", "b")]),
    ("RENAME TABLE a TO a2, b TO b2", [("rename_table", "a", None, "a2"), ("rename_table", "b", None, "b2")]),
    ("ALTER TABLE a2 RENAME TO a", [("rename_table", "a2", None, "a")]),
    ("ALTER TABLE `DB`.a RENAME AS `DB2`.a", [("rename_table", "a", None, "a", "DB2")]),
    ("RENAME TABLE `DB2`.a TO `DB`.a", [("rename_table", "DB2.a", None, "a", "DB")]),
    ("DROP TABLE IF EXISTS a, `we``ird`, missing", [("drop_table", "a"), ("drop_table", "we`ird"),
                                                   ("drop_table", "missing")]),
    ("DROP TABLE b2", [("drop_table", "b2")]),
    ("CREATE VIEW v AS SELECT 1 AS one", []),
    ("CREATE TEMPORARY TABLE tmp (id int)", None),  # not logged in ROW format (None: no statement in the log)
    ("DROP DATABASE `DB2`", [("drop_database", None)]),
]


def test_each_ddl_read_from_the_log_parses_to_its_schema_changes(mariadb, mysql_db: str) -> None:
    db2 = mysql_db[:40] + "_two"
    mariadb.sql(f"DROP DATABASE IF EXISTS `{db2}`; CREATE DATABASE `{db2}`")
    info = parse_url(mariadb.url_for(mysql_db))
    with connect(info) as conn:
        start = C.current_end(conn, mariadb=True)
        charsets = collation_charsets(conn)
    statements = [sql.replace("`DB2`", f"`{db2}`").replace("`DB`", f"`{mysql_db}`") for sql, _ in CASES]
    mariadb.sql(";\n".join(statements), database=mysql_db)
    with connect(info) as conn:
        end = C.current_end(conn, mariadb=True)
    logged = [s for t in C.read_range(info, start.file, end.file, RowDecoder(charsets, True), server_id=9201)
              for s in t.statements]
    expected = [(sql, want) for sql, want in CASES if want is not None]
    assert len(logged) == len(expected), [s.sql for s in logged]
    for statement, (sql, want) in zip(logged, expected):
        # The session's database, the default of unqualified names (a logged DROP DATABASE names the dropped one).
        assert statement.database == (db2 if sql.startswith("DROP DATABASE") else mysql_db)
        got = _short(statement.changes, mysql_db)
        assert want is not None
        want = [tuple(mysql_db if w == "DB" else w.replace("DB2", db2) if isinstance(w, str) else w for w in row)
                for row in want]
        if sql.startswith("DROP DATABASE"):
            want = [("drop_database", f"{db2}.None")]
        assert got == want, (sql, statement.sql)


def test_names_quoting_comments_and_what_is_not_known() -> None:
    assert parse("ALTER TABLE /* c */ `s`.`t``x` -- line\n ADD COLUMN `a b` int # end", "d") == (
        SchemaChange("add_column", "s", "t`x", "a b", definition="int"),)
    assert parse('/*!40000 ALTER TABLE "t" DISABLE KEYS */', "d") == (SchemaChange("options", "d", "t"),)
    assert parse("DROP TABLE `a`,`b` /* generated by server */", "d") == (
        SchemaChange("drop_table", "d", "a"), SchemaChange("drop_table", "d", "b"))
    assert parse("ALTER TABLE t ADD c int DEFAULT 1, ADD d int", "") == (
        SchemaChange("add_column", "", "t", "c", definition="int DEFAULT 1"),
        SchemaChange("add_column", "", "t", "d", definition="int"))
    assert parse("ALTER TABLE t MODIFY c enum('a,b','c')", "d")[0].definition == "enum('a,b','c')"
    assert [c.definition for c in parse("ALTER TABLE t ADD a int NOT NULL FIRST, CHANGE b b2 text AFTER `a`", "d")] \
        == ["int NOT NULL", "text"]
    assert parse("CREATE DEFINER=`root`@`localhost` TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET @x = 1", "d") == ()
    for sql in ("GRANT SELECT ON d.* TO u", "CREATE USER u", "CREATE DATABASE x", "ANALYZE TABLE t",
                "CREATE OR REPLACE ALGORITHM=MERGE VIEW v AS SELECT 1", "SAVEPOINT s", "DROP VIEW v"):
        assert parse(sql, "d") == (), sql
    # Touches rows without row events, or cannot be read: one 'unknown' change, with its table when known.
    assert parse("ALTER TABLE t DROP PARTITION p0", "d") == (
        SchemaChange("unknown", "d", "t", definition="DROP PARTITION p0"),)
    for sql in ("INSERT INTO t VALUES (1)", "UPDATE t SET a = 1", "LOCK TABLES t WRITE", "ALTER TABLE"):
        (change,) = parse(sql, "d")
        assert change.kind == "unknown" and change.table is None and change.definition == sql
    assert parse("ALTER TABLE t DISCARD TABLESPACE", "d")[0].kind == "unknown"


def test_a_statement_kept_for_a_re_snapshot_carries_no_value() -> None:
    """What the source keeps of a statement it acts on (its checkpoint, the warning's reason): strings as '?'."""
    from flinkish_spark.connectors.mysql.planning import DdlSeen, redacted

    seen = DdlSeen(None, "unknown", redacted("ALTER SERVER s OPTIONS (PASSWORD 'se''cr\\'et', HOST \"h\")"), "b.1:4")
    assert "se" not in seen.reason and "'?'" in seen.reason and "b.1:4" in seen.reason
    assert DdlSeen.from_json(seen.to_json()) == seen
    part = DdlSeen("shop.t", "unknown", "ALTER TABLE t DROP PARTITION p0", "b.1:9")
    assert part.reason.startswith("a statement changed its rows without row events in the binary log")


def test_exchange_partition_names_both_tables_whose_rows_change_without_row_events() -> None:
    from flinkish_spark.connectors.mysql import ddl

    got = [(c.kind, c.database, c.table) for c in ddl.parse("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE b.u", "a")]
    assert got == [("unknown", "a", "t"), ("unknown", "b", "u")]
    got = [(c.kind, c.table) for c in ddl.parse("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE u WITHOUT VALIDATION", "a")]
    assert got == [("unknown", "t"), ("unknown", "u")]


def test_a_statement_under_set_statement_for_is_the_statement() -> None:
    """MariaDB's ``SET STATEMENT var=value [, ...] FOR <statement>`` logs the whole text: the statement after ``FOR``
    is what changes the table (a partition dropped this way deletes rows without row events)."""
    from flinkish_spark.connectors.mysql import ddl

    got = [(c.kind, c.database, c.table) for c in ddl.parse(
        "SET STATEMENT max_statement_time=60, sql_mode='NO_ENGINE_SUBSTITUTION,FOR' FOR ALTER TABLE t DROP PARTITION p0",
        "a")]
    assert got == [("unknown", "a", "t")]
    got = [(c.kind, c.table, c.column) for c in ddl.parse(
        "SET STATEMENT lock_wait_timeout=5 FOR ALTER TABLE t ADD COLUMN c int", "a")]
    assert got == [("add_column", "t", "c")]
    assert ddl.parse("SET STATEMENT lock_wait_timeout=5 FOR", "a")[0].kind == "unknown"  # no statement after FOR
    assert ddl.parse("SET @x = 1", "a") == ()  # a plain SET changes no table
