"""The ``flinkish.mysql`` enumerator (driver): the CDC core's multi-table enumerator over the binary log.

Everything but the start is shared: the registry, catalog polls, re-snapshots and drains are
:class:`flinkish_spark.connectors.cdc.tables_enumerator.TablesEnumeratorCore`'s; the change split (its
ranges, a purged position, the release on completion) is
:class:`flinkish_spark.connectors.cdc.change_split.ChangeSplitEnumerator`'s, asking
:class:`flinkish_spark.connectors.mysql.dialect.MysqlDialect`.

**The start** (of each generation): the matching tables (those without a primary key left out with a
warning, one of an engine without transactions refused), then the log's position now (``join_mark``:
the change split starts there, recorded in its payload since there is no slot), then the core's first
planning (the chunks). Every change after that position is in the change split, and each chunk reads
a snapshot taken after it, so a key's last row in the stream is its row at the end (the sink applies
rows by key; docs/mysql-source.md).

**The range record**: the state written with each checkpoint carries the newest change range planned
(:class:`..dialect.RangeRecord`: its start and end, its changes, the server's GTID state at its end), beside the
change split's file+offset integer, for ``flinkish inspect`` and a failover (docs/mysql-source.md).
"""

from __future__ import annotations

import json
from typing import Any, Collection, Protocol

from flinkish_spark.connectors.cdc.change_split import ChangeSplitEnumerator, change_split
from flinkish_spark.connectors.cdc.host import ChangeSourceHost
from flinkish_spark.connectors.cdc.patterns import split_followable
from flinkish_spark.connectors.cdc.tables_enumerator import TablesEnumeratorCore
from flinkish_spark.connectors.mysql.connection import ConnectionInfo
from flinkish_spark.connectors.mysql.dialect import MysqlDialect
from flinkish_spark.source.split import Split


class MysqlSourceHost(ChangeSourceHost, Protocol):
    """What the enumerator and the reader need of the ``flinkish.mysql`` data source."""

    conn_info: ConnectionInfo
    server_id: int  # the first replica id the log readers take (each read its own above it)


def mysql_dialect(source: MysqlSourceHost) -> MysqlDialect:
    return MysqlDialect(source.conn_info, source.component, source.patterns, source.server_id)


class MysqlEnumerator(TablesEnumeratorCore, ChangeSplitEnumerator):
    """The CDC core's part, over the change split; the start is MySQL's (see the module docstring)."""

    source: MysqlSourceHost
    dialect: MysqlDialect

    def __init__(self, source: MysqlSourceHost) -> None:
        super().__init__(source)
        self.dialect = mysql_dialect(source)
        self.start_position: int | None = None  # where this generation's change split starts (the log's key)
        self._init_tables()

    def _state(self) -> dict[str, Any]:
        # "range": the newest change range planned (start, end, changes, the GTID state at its end), written with
        # the checkpoint that names it; informational (flinkish inspect), never read back to plan
        planned = self.dialect.planned
        return {**super()._state(), "start_position": self.start_position,
                **({"range": planned.to_json()} if planned is not None else {})}

    def restore(self, state: bytes) -> None:
        super().restore(state)
        if state:
            start = json.loads(state).get("start_position")
            self.start_position = None if start is None else int(start)

    def _change_split(self) -> Split:
        return change_split(self.generation, self.start_position)

    def _start(self, known: Collection[str]) -> list[Split]:
        with self.dialect.connect() as conn:
            found, left_out = split_followable(self.dialect.find_tables(conn, self.patterns))
            self._leave_out(left_out)
            for table in found:
                self.dialect.check_followable(table)  # MyISAM & co: one clear error, not a wrong target
            if self.uses_slot:
                # Before the chunks: each chunk's snapshot is taken after this position, so the changes from
                # here cover everything a chunk missed.
                self.start_position = self.dialect.join_mark(conn).position
            return self._first_planning(conn, found, known)
