"""The publication a ``flinkish.postgres`` source reads its table's changes through.

Guarantee: the source reads through a publication that sends *every* change of every row and
column of its table, under the table's own name -- or it refuses to start, naming the
publication and the statement that fixes it. What it checks, since any of these would make
changes vanish without a trace (pgoutput simply does not send them):

* the operations: ``insert``, ``update``, ``delete`` and ``truncate`` (a truncate the source
  does not see would leave the target diverged for ever; seen, it stops the source);
* a partitioned table: its changes are logged under its leaf partitions' names, so the
  publication must publish them as the partitioned table's (``publish_via_partition_root``,
  PostgreSQL 13+), which the publication this source creates does;
* membership of the table (also through ``FOR ALL TABLES`` or ``FOR TABLES IN SCHEMA``);
* PostgreSQL 15+: no row filter (``WHERE``) and no column list that leaves out a column the source reads (with
  the source's option ``transforms`` its kept ones: :mod:`.source.columns`).

With ``transforms`` the source's own publication carries a column list per table (:func:`create`, :func:`add`,
:func:`set_columns`), kept up to date by the catalog poll.

A multi-table source's publication holds many tables: :func:`add` and :func:`drop` change it
as tables join and leave (only a publication the source created).

Catalog rows are read as JSON, so the columns a version lacks (``attnames``, ``rowfilter``
before 15) are simply absent instead of an error.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from flinkish_spark.errors import PostgresSourceError

OPERATIONS = ("insert", "update", "delete", "truncate")


#: Per table, the column list its publication entry carries (PostgreSQL 15+; absent or None: every column).
ColumnLists = Mapping[tuple[str, str], "Sequence[str] | None"]


def _entries(tables: Sequence[tuple[str, str]], columns: ColumnLists | None) -> Any:
    sql = __import__("psycopg").sql
    parts = []
    for s, t in tables:
        cols = (columns or {}).get((s, t))
        part = sql.Identifier(s, t)
        if cols is not None:
            part = sql.SQL("{} ({})").format(part, sql.SQL(", ").join(sql.Identifier(c) for c in cols))
        parts.append(part)
    return sql.SQL(", ").join(parts)


def create(conn: Any, publication: str, tables: Sequence[tuple[str, str]], columns: ColumnLists | None = None) -> None:
    """``CREATE PUBLICATION`` for ``tables``: every operation, partitions as the partitioned table; a table of
    ``columns`` with its column list (the source's option ``transforms``: :mod:`.source.columns`)."""
    sql = __import__("psycopg").sql
    conn.execute(
        sql.SQL("CREATE PUBLICATION {} FOR TABLE {} WITH (publish = {}, publish_via_partition_root = true)").format(
            sql.Identifier(publication), _entries(tables, columns), sql.Literal(", ".join(OPERATIONS)),
        )
    )


def published(conn: Any, publication: str) -> set[tuple[str, str]]:
    """The (schema, table) names ``publication`` publishes (empty when there is no such publication)."""
    rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (publication,))
    return {(str(s), str(t)) for s, t in rows.fetchall()}


def add(conn: Any, publication: str, tables: Sequence[tuple[str, str]], columns: ColumnLists | None = None) -> None:
    """``ALTER PUBLICATION ... ADD TABLE`` the ``tables`` not in it yet (of a publication this source created)."""
    todo = [t for t in tables if t not in published(conn, publication)]
    if todo:
        sql = __import__("psycopg").sql
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(publication), _entries(todo, columns)))


def column_lists(conn: Any, publication: str) -> dict[tuple[str, str], list[str] | None]:
    """The column list of each table a member of ``publication`` by name (None: no list, every column). PostgreSQL
    15+ (``prattrs``)."""
    rows = conn.execute(
        "SELECT n.nspname::text, c.relname::text, (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM "
        "pg_attribute a WHERE a.attrelid = pr.prrelid AND a.attnum = ANY(pr.prattrs)) FROM pg_publication_rel pr "
        "JOIN pg_publication p ON p.oid = pr.prpubid JOIN pg_class c ON c.oid = pr.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.pubname = %s", (publication,)).fetchall()
    return {(str(s), str(t)): None if cols is None else [str(c) for c in cols] for s, t, cols in rows}


def set_columns(conn: Any, publication: str, table: tuple[str, str], columns: Sequence[str] | None) -> None:
    """Give ``table`` (a member of ``publication``, one this source created) the column list ``columns``: drop and
    add it in one transaction (PostgreSQL 15 cannot alter one member's list), so that no change between is lost --
    a change is decoded with the publication as its own commit saw it."""
    sql = __import__("psycopg").sql
    with conn.transaction():
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(sql.Identifier(publication),
                                                                         sql.Identifier(*table)))
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(
            sql.Identifier(publication), _entries([table], {table: columns})))


def drop(conn: Any, publication: str, oid: int) -> None:
    """Take the table ``oid`` out of ``publication`` (one this source created), if it is in it by name."""
    row = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_publication_rel pr ON pr.prrelid = c.oid JOIN pg_publication p ON p.oid = pr.prpubid "
        "WHERE c.oid = %s AND p.pubname = %s", (oid, publication)).fetchone()
    if row is not None:  # gone with a DROP TABLE, or never a member by name
        sql = __import__("psycopg").sql
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(
            sql.Identifier(publication), sql.Identifier(str(row[0]), str(row[1]))))


def exists(conn: Any, publication: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (publication,)).fetchone() is not None


def check(conn: Any, publication: str, table: tuple[str, str], columns: Sequence[str], what: str) -> None:
    """Refuse an existing ``publication`` through which some change of ``table`` would not arrive."""
    row = conn.execute("SELECT to_jsonb(p) FROM pg_publication p WHERE pubname = %s", (publication,)).fetchone()
    if row is None:
        return
    pub = row[0]
    name = f"{table[0]}.{table[1]}"
    missing_ops = [op for op in OPERATIONS if pub.get(f"pub{op}") is False]
    if missing_ops:
        wanted = [op for op in OPERATIONS if op not in missing_ops]
        raise PostgresSourceError(
            f"{what}: the publication {publication!r} does not publish {', '.join(missing_ops)} (publish = "
            f"'{', '.join(wanted)}'), so those changes of {name} would never reach the target. Publish them: "
            f"ALTER PUBLICATION {publication} SET (publish = '{', '.join(OPERATIONS)}'); or name another publication"
        )
    partitioned = conn.execute(
        "SELECT c.relkind = 'p' FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s", table,
    ).fetchone()
    if partitioned is not None and partitioned[0] and not pub.get("pubviaroot", False):
        raise PostgresSourceError(
            f"{what}: {name} is partitioned, and the publication {publication!r} publishes the changes under the names "
            f"of its partitions, which the source would never see as changes of {name}. Publish them as the "
            f"partitioned table's: ALTER PUBLICATION {publication} SET (publish_via_partition_root = true); or leave "
            "the option 'publication' out and the source creates its own"
        )
    rows = conn.execute(
        "SELECT to_jsonb(t) FROM pg_publication_tables t WHERE pubname = %s AND schemaname = %s AND tablename = %s",
        (publication, *table),
    ).fetchall()
    if not rows:
        raise PostgresSourceError(
            f"{what}: the publication {publication!r} does not publish {name}; "
            f"ALTER PUBLICATION {publication} ADD TABLE {name}, or name another publication"
        )
    entry = rows[0][0]
    fix = (f"ALTER PUBLICATION {publication} SET TABLE {name} (for a publication of several tables: DROP TABLE, "
           "then ADD TABLE without it); or name another publication")
    if entry.get("rowfilter"):
        raise PostgresSourceError(
            f"{what}: the publication {publication!r} publishes only the rows of {name} WHERE {entry['rowfilter']}: "
            "changes of the other rows, and of rows that leave the filter, would never reach the target. Publish all "
            f"rows: {fix}"
        )
    published = entry.get("attnames")
    if published is not None:
        left_out = [c for c in columns if c not in published]
        if left_out:
            raise PostgresSourceError(
                f"{what}: the publication {publication!r} publishes only the columns {', '.join(published)} of {name} "
                f"and misses {', '.join(left_out)}, whose values the changes would lack. Publish every column: {fix}"
            )
