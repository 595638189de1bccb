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
    has_key: bool  # a primary key
    replica_identity: ReplicaIdentity
    readable: bool

    @property
    def key_problem(self) -> str | None:
        """Why the table has no key its changes can be applied by (None: it has one).

        The key is the primary key, or -- under ``REPLICA IDENTITY USING INDEX`` -- the columns of that
        unique index (PostgreSQL requires it unique, not partial, on NOT NULL columns; deletes and updates
        carry exactly them). ``REPLICA IDENTITY FULL`` without a primary key is not enough: two equal rows
        cannot be told apart, so an update or delete of one could not name its row in the target.
        """
        if self.replica_identity == "i":
            return None
        if self.replica_identity == "n":
            return "it has REPLICA IDENTITY NOTHING, so its updates and deletes carry no key"
        if not self.has_key:
            return ("it has no primary key" + (" (REPLICA IDENTITY FULL alone does not tell equal rows apart)"
                                               if self.replica_identity == "f" else ""))
        return None

    def not_followed(self) -> str:
        """The warning for a table :attr:`key_problem` leaves out: what to do, and that no restart is needed."""
        return (f"{self.name} is not followed: {self.key_problem}. ALTER TABLE {self.name} ADD PRIMARY KEY (...) "
                f"or ALTER TABLE {self.name} REPLICA IDENTITY USING INDEX <a unique index on NOT NULL columns>, and it "
                "is picked up (snapshot, then its changes) at the next catalog poll, without a restart")


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
    """A table this role may read, or one clear error naming it and the fix. A table without a usable key is
    no error: it is left out with a warning (:attr:`FoundTable.key_problem`, :func:`split_followable`)."""
    if not table.readable:
        raise PostgresSourceError(f"{what}: table {table.name} matches 'tables' but this role may not read it: "
                                  f"GRANT SELECT ON {table.name} TO {role}, or exclude it with !{table.name}")


#: In a multi-table source's folder: the matching tables it leaves out for want of a key -> its warning, written
#: by the enumerator (driver) whenever that set changes -- at once, not with the next epoch (an idle source plans
#: none) -- for the progress view and ``flinkish inspect``.
NOT_FOLLOWED_FILE = "not-followed.json"


def write_not_followed(io: Any, directory: str, tables: dict[str, str]) -> None:
    import json

    io.write_bytes(f"{directory}/{NOT_FOLLOWED_FILE}", json.dumps(tables, sort_keys=True).encode())


def read_not_followed(io: Any, directory: str) -> dict[str, str]:
    """What :func:`write_not_followed` wrote last (empty: none, or nothing written yet)."""
    import json

    try:
        d = json.loads(io.read_bytes(f"{directory}/{NOT_FOLLOWED_FILE}"))
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): str(v) for k, v in d.items()} if isinstance(d, dict) else {}


def split_followable(found: list[FoundTable]) -> tuple[list[FoundTable], list[FoundTable]]:
    """``found`` as (the tables with a usable key, those without one: left out, with a warning)."""
    return [t for t in found if t.key_problem is None], [t for t in found if t.key_problem is not None]


def table_problems(found: list[FoundTable], patterns: TablePatterns, what: str, uses_slot: bool,
                   role: str = "<the role>") -> list[PostgresSourceError]:
    """Every reason the matching tables ``found`` cannot be mirrored (none matching, or each table that cannot
    be read), one error each -- for a preflight that names them all at once. Tables without a usable key are
    no problem here (:func:`split_followable`: they are left out with a warning)."""
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
    """The matching tables, each one readable (those without a usable key too: see :func:`split_followable`);
    a clear error when none matches or one cannot be read."""
    found = find_tables(conn, patterns)
    problems = table_problems(found, patterns, what, uses_slot)
    if problems:
        raise problems[0]
    return found
