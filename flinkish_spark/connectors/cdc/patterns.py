"""The ``tables`` option: table names and patterns, and which tables of the server match them.

``tables = "public.*, sales.order_*, !public.audit_log"``: comma-separated entries
``schema.table`` (for MySQL: ``database.table``); ``*`` matches any characters, ``?`` one; a
leading ``!`` excludes what the entry matches. Unquoted parts are folded to lower case,
``"Double quoted"`` parts are taken as written (and their ``*``/``?`` are literal).

Shared by every database of the CDC core: the dialect lists its tables as :class:`FoundTable`
(PostgreSQL: :func:`flinkish_spark.connectors.postgres.source.discovery.find_tables`, which says
which relations can match at all); :func:`split_followable` leaves out, with a warning, the
tables whose changes cannot be applied by key, and :func:`write_not_followed` records them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flinkish_spark.errors import ConfigError

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
    """A table of the server that matches the patterns, as the dialect's catalog shows it."""

    oid: int  # the dialect's stable table id (PostgreSQL: pg_class.oid): the registry's key
    name: str  # schema.table
    schema: str
    table: str
    readable: bool  # this role may read it
    #: Why the table has no key its changes can be applied by (None: it has one); see the dialect's rule.
    key_problem: str | None = None
    key_fix: str = ""  # what gives it one (statements to run), for :meth:`not_followed`

    def not_followed(self) -> str:
        """The warning for a table :attr:`key_problem` leaves out: what to do, and that no restart is needed."""
        return (f"{self.name} is not followed: {self.key_problem}. {self.key_fix}, and it "
                "is picked up (snapshot, then its changes) at the next catalog poll, without a restart")


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
