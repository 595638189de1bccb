"""What the MySQL dialect's planning (:meth:`.dialect.MysqlDialect.change_target`) records of a change range.

* :class:`RangeRecord` -- the range as planned: its start and end (position keys), its changes and the server's
  GTID state at its end. The enumerator writes it into its state, so the checkpoint that names the range carries
  it beside the change split's file+offset integer (``flinkish inspect`` shows it). It is information, never read
  back to plan: a restart plans from the split's position.
* :class:`DdlSeen` -- a statement of :data:`ACTED_ON` on a followed table in the range: the rows changed without row
  events (``ALTER TABLE ... DROP/TRUNCATE PARTITION``, ``CONVERT TO CHARACTER SET``, a statement the parser cannot
  read) or the key changed. The enumerator keeps it in its state and, at its next planning, snapshots the table
  again (or leaves it out when it has no key any more): the target is never silently wrong (docs/mysql-source.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_LITERAL = re.compile(r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.|\"\")*\"")


def redacted(sql: str) -> str:
    """``sql`` with its quoted strings as ``'?'``: a statement kept for a message or a checkpoint never carries a
    value (a password in a statement the parser cannot read)."""
    return _LITERAL.sub("'?'", sql)


#: Statement kinds (ddl.SchemaChange) on a followed table that change its rows without row events or its key:
#: ``unknown`` (partitions dropped or truncated, CONVERT TO CHARACTER SET, a statement the parser cannot read) and
#: ``primary_key``. The enumerator re-snapshots the table, or leaves it out when it has no key any more.
ACTED_ON = frozenset({"unknown", "primary_key"})


@dataclass(frozen=True)
class DdlSeen:
    """A statement of :data:`ACTED_ON` in a planned range: its table (``database.table``; None when the statement
    could not be read), its kind, its text (:func:`redacted`) and position (for the log)."""

    table: str | None
    kind: str
    sql: str
    position: str

    @property
    def reason(self) -> str:
        text = " ".join(self.sql.split())
        text = text if len(text) <= 120 else text[:117] + "..."
        what = ("its primary key changed" if self.kind == "primary_key"
                else "a statement changed its rows without row events in the binary log")
        return f"{what} ({text!r} at {self.position})"

    def to_json(self) -> dict[str, Any]:
        return {"table": self.table, "kind": self.kind, "sql": self.sql, "position": self.position}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "DdlSeen":
        table = d.get("table")
        return cls(None if table is None else str(table), str(d["kind"]), str(d["sql"]), str(d["position"]))


@dataclass(frozen=True)
class RangeRecord:
    """A change range as planned, kept in the enumerator's state of the checkpoint that names it: its ``start`` and
    ``end`` (position keys), the ``changes`` of followed tables in it (rows, truncates and the statements of
    :data:`ACTED_ON`: an update is one) -- counted only when the range was planned with a limit
    (``maxRowsPerTrigger``); otherwise its ``events`` (row events, each of one row or of hundreds, truncates,
    statements) and their ``bytes`` (:mod:`.range_scan`): the rows of such an epoch are Spark's count of its
    tasks' rows (the query's progress, ``numInputRows``) -- and the server's GTID state at its end (MariaDB:
    ``domain-server-seq`` per domain; MySQL: the executed set, known at the log's end only; None without GTIDs).
    What ``flinkish inspect`` shows; for a failover replica, whose file positions differ, the GTID state names the same point (a start from it is not implemented)."""

    start: int
    end: int
    changes: int | None  # None: not counted (a range planned without a limit: events and bytes instead)
    gtid: str | None
    events: int | None = None  # row events of followed tables and statements counted as changes (not counted: None)
    bytes: int | None = None  # those row events' bytes

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end, "changes": self.changes, "gtid": self.gtid}
        if self.events is not None:
            out.update(events=self.events, bytes=self.bytes)
        return out
