"""Which tables of a MySQL/MariaDB server match ``tables`` patterns, and what each needs before it can be mirrored.

``tables = "shop.*, crm.customers, !shop.audit_log"``: the patterns of the PostgreSQL source (shell-style
``*``/``?``, a leading ``!`` excludes) over ``database.table``. MySQL names are case-sensitive on most
servers while an unquoted pattern is folded to lower case, so a name matches when it or its lower-case
form does (``shop.*`` finds ``shop.Orders``); a ``"Quoted"`` part is matched as written. Base tables
only (no views); the server's own databases (``mysql``, ``sys``, ``information_schema``,
``performance_schema``) never match.

Guarantee, the rule of the PostgreSQL source (docs/mirror.md, "A table without a primary key never stops
the mirror"): a matching table without a primary key is no error but *not followed*, with a warning that
names the ``ALTER TABLE`` which fixes it (:meth:`MysqlTable.not_followed`). A table whose engine has no
transactions (MyISAM, Aria, MEMORY) cannot be read in the consistent snapshot the binary log continues
(:mod:`.snapshot`): :meth:`MysqlTable.engine_problem` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SYSTEM_DATABASES = ("mysql", "sys", "information_schema", "performance_schema")
#: Engines whose reads take part in ``START TRANSACTION WITH CONSISTENT SNAPSHOT``.
TRANSACTIONAL_ENGINES = frozenset({"innodb"})


@dataclass(frozen=True)
class MysqlTable:
    database: str
    table: str
    has_key: bool  # a primary key
    engine: str

    @property
    def name(self) -> str:
        return f"{self.database}.{self.table}"

    def not_followed(self) -> str | None:
        """The warning for a table without a primary key (None: it has one)."""
        if self.has_key:
            return None
        return (f"{self.name} is not followed: it has no primary key. ALTER TABLE {self.name} ADD PRIMARY KEY (...), "
                "and it is picked up (snapshot, then its changes) at the next catalog poll, without a restart")

    def engine_problem(self, what: str) -> str | None:
        """Why the table cannot be snapshotted consistently (None: it can)."""
        if self.engine.lower() in TRANSACTIONAL_ENGINES:
            return None
        return (f"{what}: table {self.name} uses the {self.engine or 'unknown'} engine, which has no transactions: "
                f"its rows cannot be read in the consistent snapshot the binary log continues. ALTER TABLE "
                f"{self.name} ENGINE = InnoDB, or exclude it with !{self.name}")


def matches(patterns: Any, name: str) -> bool:
    """Whether ``database.table`` is one of ``patterns`` (a ``TablePatterns``): as written or in lower case."""
    forms = {name, name.lower()}
    return (any(p.fullmatch(f) for p in patterns.include for f in forms)
            and not any(p.fullmatch(f) for p in patterns.exclude for f in forms))


def find_tables(conn: Any, patterns: Any) -> list[MysqlTable]:
    """The base tables this user can see that match ``patterns``, in name order."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT t.TABLE_SCHEMA, t.TABLE_NAME, t.ENGINE, EXISTS (SELECT 1 FROM information_schema.TABLE_CONSTRAINTS c "
            "WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME AND c.CONSTRAINT_TYPE = 'PRIMARY KEY') "
            "FROM information_schema.TABLES t WHERE t.TABLE_TYPE = 'BASE TABLE' AND t.TABLE_SCHEMA NOT IN "
            f"({', '.join(['%s'] * len(SYSTEM_DATABASES))})", SYSTEM_DATABASES)
        rows = cur.fetchall()
    found = [MysqlTable(str(db), str(t), bool(k), str(e or "")) for db, t, e, k in rows]
    return sorted((f for f in found if matches(patterns, f.name)), key=lambda f: f.name)
