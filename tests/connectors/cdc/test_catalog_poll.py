"""The catalog poll over a dialect (no server): a fake database in memory stands behind the protocol, so what the
core decides -- who joins, waits, leaves, is snapshotted again, and the chunk splits -- is seen for any database."""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ContextManager

from flinkish_spark.connectors.cdc import catalog_poll as poll
from flinkish_spark.connectors.cdc.dialect import CatalogDialect, JoinMark, TableChunks
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.errors import TerminalError


@dataclass
class FakeDb:
    """Tables by id: (schema, table, signature, keyed); a transaction counter; a log position."""

    tables: dict[int, tuple[str, str, Any, bool]] = field(default_factory=dict)
    next_xid: int = 100
    oldest_running: int = 99  # the oldest transaction still running (one older than any join)
    position: int = 5000
    unread_from: int = 10**9  # the oldest position still unread by the change split
    followed: list[str] = field(default_factory=list)

    component = "fake source"

    def error(self, message: str) -> TerminalError:
        return TerminalError(message)

    def connect(self) -> ContextManager[Any]:
        return nullcontext(self)

    def find_tables(self, conn: Any, patterns: TablePatterns) -> list[FoundTable]:
        out = [FoundTable(oid, f"{s}.{t}", s, t, True, None if keyed else "it has no primary key", "ADD one")
               for oid, (s, t, _, keyed) in self.tables.items()]
        return sorted((f for f in out if patterns.matches(f.name)), key=lambda f: f.name)

    def check_followable(self, table: FoundTable) -> None:
        pass

    def follow(self, conn: Any, tables: list[FoundTable]) -> None:
        self.followed += [t.name for t in tables]

    def unfollow(self, conn: Any, oid: int) -> None:
        pass

    def primary_keys(self, conn: Any, oids: list[int]) -> dict[int, tuple[str, ...]]:
        return {o: ("id",) for o in oids if o in self.tables and self.tables[o][3]}

    def signatures(self, conn: Any, oids: list[int]) -> dict[int, Any]:
        return {o: self.tables[o][2] for o in oids if o in self.tables}

    def signature_change(self, conn: Any, old: Any, new: Any) -> str | None:
        return "rewritten" if old[0] != new[0] else None  # [rewrite count, column count]: columns flow

    def join_mark(self, conn: Any) -> JoinMark:
        return JoinMark(self.next_xid, self.position)

    def current_position(self, conn: Any) -> int:
        return self.position

    def transaction_horizon(self, conn: Any) -> int:
        return self.oldest_running

    def unread_before(self, conn: Any, positions: list[int]) -> int:
        return max([p for p in positions if p <= self.unread_from], default=-1)

    def table_name(self, conn: Any, oid: int) -> str | None:
        return None if oid not in self.tables else ".".join(self.tables[oid][:2])

    def plan_chunks(self, conn: Any, entry: TableEntry, split_size: int) -> TableChunks:
        return TableChunks([(None, 10), (10, None)], {"column": "id"})


def test_a_fake_database_fits_the_protocol() -> None:
    db: CatalogDialect = FakeDb()  # mypy holds the fake to the protocol (tests/test_typing.py)
    assert db.component == "fake source"


def test_a_new_table_joins_waits_for_older_transactions_then_gets_bracketed_chunks() -> None:
    db = FakeDb({1: ("shop", "a", [0, 2], True)})
    patterns = TablePatterns.parse("shop.*", "t")
    entries, next_tid = poll.first_entries(db, db, db.find_tables(db, patterns), 0, streaming=False)
    splits, planned = poll.plan_chunks(db, db, entries, 0, 100)
    assert planned == {0} and [s.split_id for s in splits] == ["snapshot-0-t0-00000", "snapshot-0-t0-00001"]
    assert json.loads(splits[0].payload or "") == {"tid": 0, "oid": 1, "table": "shop.a", "lo": None, "hi": 10,
                                                   "column": "id", "after_xid": None, "resnapshot": False}

    db.tables[2] = ("shop", "b", [0, 1], True)
    db.tables[3] = ("shop", "nokey", [0, 1], False)
    p = poll.Poll(entries, next_tid, ())
    left_out: list[str] = []
    poll.poll(db, db, patterns, p, lambda ts: left_out.extend(t.name for t in ts))
    assert left_out == ["shop.nokey"] and db.followed == ["shop.b"] and p.changed
    joining = next(e for e in p.entries if e.name == "shop.b")
    assert (joining.tid, joining.state, joining.after_xid, joining.after_lsn) == (1, "joining", 100, None)
    assert poll.plan_ready(db, db, p, 0, 100) == []  # a transaction older than the join still runs
    db.oldest_running = 100  # every transaction numbered before the join has ended
    ready = poll.plan_ready(db, db, p, 0, 100)
    assert [json.loads(s.payload or "")["resnapshot"] for s in ready] == [True, True]  # replaces, never merges
    assert next(e for e in p.entries if e.name == "shop.b").state == "snapshot"


def test_a_rename_ends_the_entry_and_a_table_taking_the_name_waits_for_its_unread_changes() -> None:
    db = FakeDb({1: ("shop", "a", [0, 1], True)})
    patterns = TablePatterns.parse("shop.*", "t")
    entries, next_tid = poll.first_entries(db, db, db.find_tables(db, patterns), 0, streaming=True)
    p = poll.Poll(entries, next_tid, ())
    db.tables = {1: ("shop", "a_old", [0, 1], True), 2: ("shop", "a", [0, 1], True)}  # swapped in by RENAME
    db.unread_from, db.oldest_running = 4000, 200
    poll.poll(db, db, patterns, p, lambda ts: None)
    assert p.ended == (("shop.a", 5000),)
    by_name = {e.name: e for e in p.entries}
    assert by_name["shop.a"].oid == 2 and by_name["shop.a"].after_lsn == 5000  # the old table's changes first
    assert by_name["shop.a_old"].after_lsn is None
    assert [json.loads(s.payload or "")["table"] for s in poll.plan_ready(db, db, p, 0, 100)] == ["shop.a_old"] * 2
    db.unread_from = 10**9
    assert [json.loads(s.payload or "")["table"] for s in poll.plan_ready(db, db, p, 0, 100)] == ["shop.a"] * 2


def test_a_change_the_log_does_not_carry_snapshots_the_table_again_under_a_new_tid() -> None:
    db = FakeDb({1: ("shop", "a", [0, 1], True), 2: ("shop", "b", [0, 1], True)})
    patterns = TablePatterns.parse("shop.*", "t")
    entries, next_tid = poll.first_entries(db, db, db.find_tables(db, patterns), 0, streaming=True)
    db.tables[1] = ("shop", "a", [1, 1], True)  # rewritten without row changes
    db.tables[2] = ("shop", "b", [0, 2], True)  # a column the log carries
    out, next_tid, altered = poll.compare_signatures(db, db, entries, next_tid)
    by_name = {e.name: e for e in out}
    assert altered and next_tid == 3
    assert (by_name["shop.a"].tid, by_name["shop.a"].state, by_name["shop.a"].reason) == (2, "joining", "rewritten")
    assert (by_name["shop.b"].tid, by_name["shop.b"].state, by_name["shop.b"].signature) == (1, "streaming", [0, 2])
    assert Registry().with_entries(out, next_tid).by_tid().keys() == {1, 2}
