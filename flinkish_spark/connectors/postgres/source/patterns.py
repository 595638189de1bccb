"""The ``tables`` option: table names and patterns, and which tables of the server match them.

``tables = "public.*, sales.order_*, !public.audit_log"``: comma-separated entries
``schema.table``; ``*`` matches any characters, ``?`` one; a leading ``!`` excludes what the
entry matches. Names follow PostgreSQL's rules: unquoted parts are folded to lower case,
``"Double quoted"`` parts are taken as written (and their ``*``/``?`` are literal).
Ordinary and partitioned tables match (a partition is read through its root); views,
foreign tables and the system schemas never do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from flinkish_spark.errors import ConfigError, PostgresSourceError

ReplicaIdentity = Literal["d", "f", "i", "n"]


def _part_regex(part: str, what: str, entry: str) -> str:
    """One dot-separated part (``sales`` / ``order_*`` / ``"My*Table"``) as a regular expression."""
    out, i = [], 0
    while i < len(part):
        ch = part[i]
        if ch == '"':
            end = part.find('"', i + 1)
            while end != -1 and part[end + 1:end + 2] == '"':  # "" inside quotes is one "
                end = part.find('"', end + 2)
            if end == -1:
                raise ConfigError(f"{what}: unbalanced double quote in {entry!r}")
            out.append(re.escape(part[i + 1:end].replace('""', '"')))
            i = end + 1
        elif ch == "*":
            out.append(".*")
            i += 1
        elif ch == "?":
            out.append(".")
            i += 1
        else:
            out.append(re.escape(ch.lower()))
            i += 1
    return "".join(out)


def _split_dot(entry: str) -> list[str]:
    parts: list[str] = []
    buf: list[str] = []
    quoted = False
    for ch in entry:
        if ch == '"':
            quoted = not quoted
        if ch == "." and not quoted:
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
    parts.append("".join(buf))
    return parts


@dataclass(frozen=True)
class TablePatterns:
    text: str
    include: tuple[re.Pattern[str], ...]
    exclude: tuple[re.Pattern[str], ...]

    @classmethod
    def parse(cls, text: str, what: str) -> "TablePatterns":
        include: list[re.Pattern[str]] = []
        exclude: list[re.Pattern[str]] = []
        for raw in text.split(","):
            entry = raw.strip()
            if not entry:
                continue
            negate = entry.startswith("!")
            body = entry[1:].strip() if negate else entry
            parts = _split_dot(body)
            if len(parts) != 2 or not parts[0] or not parts[1]:
                raise ConfigError(
                    f"{what}: {entry!r} is not 'schema.table'; write each entry with its schema, e.g. "
                    "public.orders, public.* or sales.order_* (a leading ! excludes)"
                )
            regex = re.compile(_part_regex(parts[0], what, entry) + r"\." + _part_regex(parts[1], what, entry), re.DOTALL)
            (exclude if negate else include).append(regex)
        if not include:
            raise ConfigError(f"{what}: no table named; give names or patterns, e.g. public.orders, public.*")
        return cls(text, tuple(include), tuple(exclude))

    def matches(self, qualified: str) -> bool:
        """Whether ``schema.table`` (unquoted, as the catalog spells it) is one of the tables."""
        return any(p.fullmatch(qualified) for p in self.include) and not any(p.fullmatch(qualified) for p in self.exclude)


@dataclass(frozen=True)
class FoundTable:
    oid: int
    name: str  # schema.table
    schema: str
    table: str
    has_key: bool
    replica_identity: ReplicaIdentity
    readable: bool


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
    found = [FoundTable(int(oid), f"{s}.{t}", str(s), str(t), bool(k), str(ri), bool(r))  # type: ignore[arg-type]
             for oid, s, t, k, ri, r in rows]
    return sorted((f for f in found if patterns.matches(f.name)), key=lambda f: f.name)


def check_followable(table: FoundTable, what: str, uses_slot: bool, role: str = "<the role>") -> None:
    """A table whose changes can be mirrored by key, or one clear error naming it and the fix."""
    if not table.readable:
        raise PostgresSourceError(f"{what}: table {table.name} matches 'tables' but this role may not read it: "
                                  f"GRANT SELECT ON {table.name} TO {role}, or exclude it with !{table.name}")
    if not table.has_key:
        raise PostgresSourceError(
            f"{what}: table {table.name} matches 'tables' but has no primary key; its snapshot is split and its "
            f"changes applied by key. Add one (ALTER TABLE {table.name} ADD PRIMARY KEY (...)), or exclude it: "
            f"'..., !{table.name}'"
        )
    if uses_slot and table.replica_identity not in ("d", "f"):
        raise PostgresSourceError(
            f"{what}: table {table.name} has REPLICA IDENTITY "
            f"{'NOTHING' if table.replica_identity == 'n' else 'USING INDEX'}, so its deletes do not carry the primary "
            f"key. Set ALTER TABLE {table.name} REPLICA IDENTITY DEFAULT (or FULL), or exclude it: '..., !{table.name}'"
        )


def table_problems(found: list[FoundTable], patterns: TablePatterns, what: str, uses_slot: bool,
                   role: str = "<the role>") -> list[PostgresSourceError]:
    """Every reason the matching tables ``found`` cannot be mirrored (none matching, or each table that cannot
    be followed), one error each -- for a preflight that names them all at once."""
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
    """The matching tables, each one followable; a clear error when none matches or one cannot be followed."""
    found = find_tables(conn, patterns)
    problems = table_problems(found, patterns, what, uses_slot)
    if problems:
        raise problems[0]
    return found
