"""Which tables of a PostgreSQL server the ``tables`` patterns select: the catalog query and the key rule.

Ordinary and partitioned tables match (a partition is read through its root); views, foreign
tables and the system schemas never do. A table's changes can be applied by key when it has a
primary key, or ``REPLICA IDENTITY USING INDEX`` (:func:`key_problem`); one without is a
:class:`~flinkish_spark.connectors.cdc.patterns.FoundTable` with a ``key_problem``, left out with a
warning by the CDC core (:func:`~flinkish_spark.connectors.cdc.patterns.split_followable`).
"""

from __future__ import annotations

from typing import Any, Literal

from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.errors import PostgresSourceError

ReplicaIdentity = Literal["d", "f", "i", "n"]


def key_problem(has_key: bool, replica_identity: ReplicaIdentity) -> str | None:
    """Why the table has no key its changes can be applied by (None: it has one).

    The key is the primary key, or -- under ``REPLICA IDENTITY USING INDEX`` -- the columns of that
    unique index (PostgreSQL requires it unique, not partial, on NOT NULL columns; deletes and updates
    carry exactly them). ``REPLICA IDENTITY FULL`` without a primary key is not enough: two equal rows
    cannot be told apart, so an update or delete of one could not name its row in the target.
    """
    if replica_identity == "i":
        return None
    if replica_identity == "n":
        return "it has REPLICA IDENTITY NOTHING, so its updates and deletes carry no key"
    if not has_key:
        return ("it has no primary key" + (" (REPLICA IDENTITY FULL alone does not tell equal rows apart)"
                                           if replica_identity == "f" else ""))
    return None


def _found(oid: int, schema: str, table: str, has_key: bool, replica_identity: ReplicaIdentity, readable: bool) -> FoundTable:
    name = f"{schema}.{table}"
    return FoundTable(oid, name, schema, table, readable, key_problem(has_key, replica_identity),
                      f"ALTER TABLE {name} ADD PRIMARY KEY (...) or ALTER TABLE {name} REPLICA IDENTITY USING INDEX "
                      "<a unique index on NOT NULL columns>")


def find_tables(conn: Any, patterns: TablePatterns) -> list[FoundTable]:
    """The tables of the database that match ``patterns``, in name order."""
    rows = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, "
        "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary), c.relreplident, "
        "has_table_privilege(c.oid, 'SELECT') "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition "
        "AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_(toast|temp)'"
    ).fetchall()
    found = [_found(int(oid), str(s), str(t), bool(k), str(ri), bool(r))  # type: ignore[arg-type]
             for oid, s, t, k, ri, r in rows]
    return sorted((f for f in found if patterns.matches(f.name)), key=lambda f: f.name)


def check_followable(table: FoundTable, what: str, uses_slot: bool, role: str = "<the role>") -> None:
    """A table this role may read, or one clear error naming it and the fix. A table without a usable key is
    no error: it is left out with a warning (:func:`key_problem`, ``split_followable``)."""
    if not table.readable:
        raise PostgresSourceError(f"{what}: table {table.name} matches 'tables' but this role may not read it: "
                                  f"GRANT SELECT ON {table.name} TO {role}, or exclude it with !{table.name}")


def table_problems(found: list[FoundTable], patterns: TablePatterns, what: str, uses_slot: bool,
                   role: str = "<the role>") -> list[PostgresSourceError]:
    """Every reason the matching tables ``found`` cannot be mirrored (none matching, or each table that cannot
    be read), one error each -- for a preflight that names them all at once. Tables without a usable key are
    no problem here (``split_followable``: they are left out with a warning)."""
    if not found:
        return [PostgresSourceError(
            f"{what}: no table matches 'tables' = {patterns.text!r} (ordinary or partitioned tables this role can "
            "see). Check the names, or create the tables first"
        )]
    problems = []
    for table in found:
        try:
            check_followable(table, what, uses_slot, role)
        except PostgresSourceError as e:
            problems.append(e)
    return problems


def followable_tables(conn: Any, patterns: TablePatterns, what: str, uses_slot: bool) -> list[FoundTable]:
    """The matching tables, each one readable (those without a usable key too: see ``split_followable``);
    a clear error when none matches or one cannot be read."""
    found = find_tables(conn, patterns)
    problems = table_problems(found, patterns, what, uses_slot)
    if problems:
        raise problems[0]
    return found
