"""The catalog poll of a multi-table CDC source (driver): tables joining, leaving, renamed, changed without row changes.

Moved out of the PostgreSQL enumerator; every database question goes to the dialect
(:class:`.dialect.CatalogDialect`), so what is decided here holds for every database:

* **Tables that join** (:func:`join`): the log carries them from a :class:`.dialect.JoinMark` on
  (``follow``, then the mark); their chunks are planned once every transaction numbered before the
  mark has ended and, for a table taking the name of one followed before, no change before the
  mark is unread (:func:`plan_ready`) -- the old table's last changes under that name never come
  after the new one's chunk rows. Why exact: docs/postgres-source.md, "New tables".
* **Tables that leave** (dropped, renamed) end their registry entry; a new name that matches joins
  anew. The name and the log position after it is remembered (``Registry.ended``) until the change
  split's committed position passes it.
* **Tables changed without row changes** (the dialect's signature, compared at each poll:
  :func:`compare_signatures`) are snapshotted again (:func:`renew`): a new tid joining after the
  statement, its chunks bracketed by ``B``/``E``.
* **Tables without a usable key** are handed to ``leave_out`` (the enumerator warns and records them).

Chunk splits (:func:`plan_chunks`) carry what every dialect's reader needs (tid, oid, table, bounds,
``after_xid``, whether bracketed) plus the dialect's own fields.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Any, Callable

from flinkish_spark.connectors.cdc.dialect import CatalogDialect
from flinkish_spark.connectors.cdc.patterns import FoundTable, TablePatterns, split_followable
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.connectors.cdc.splits import table_chunk_id
from flinkish_spark.source.split import Split

log = logging.getLogger(__name__)


@dataclass
class Poll:
    """One planning's working copy of the registry's entries (``changed``: a new registry version is due)."""

    entries: list[TableEntry]
    next_tid: int
    ended: tuple[tuple[str, int], ...]
    changed: bool = False

    @classmethod
    def of(cls, registry: Registry) -> "Poll":
        return cls(list(registry.entries), registry.next_tid, registry.ended)


def first_entries(dialect: CatalogDialect, conn: Any, found: list[FoundTable], next_tid: int,
                  streaming: bool) -> tuple[list[TableEntry], int]:
    """The entries of the tables found at the start (after the log carries them: the slot's consistent point)."""
    # Before the chunks are read: a statement after this is seen at a poll (the dialect's signature).
    sigs = dialect.signatures(conn, [t.oid for t in found])
    keys = dialect.primary_keys(conn, [t.oid for t in found])
    entries = []
    for table in found:
        entries.append(TableEntry(next_tid, table.oid, table.schema, table.table, "streaming" if streaming else "snapshot",
                                  key=keys.get(table.oid, ()), signature=sigs.get(table.oid)))
        next_tid += 1
    return entries, next_tid


def poll(dialect: CatalogDialect, conn: Any, patterns: TablePatterns, p: Poll,
         leave_out: Callable[[list[FoundTable]], None]) -> None:
    """Tables that joined, left, were renamed or changed without row changes, into ``p``."""
    found = {t.oid: t for t in dialect.find_tables(conn, patterns)}
    # An entry ends when its table was dropped or renamed (a new name that matches joins anew).
    ended = [e for e in p.entries if e.oid not in found or found[e.oid].name != e.name]
    for e in ended:
        if e.oid not in found:
            dialect.unfollow(conn, e.oid)  # renamed out of the patterns: stop decoding it
    if ended:
        position = dialect.current_position(conn)
        gone = {e.name for e in ended}
        p.ended = tuple(x for x in p.ended if x[0] not in gone) + tuple((n, position) for n in sorted(gone))
    p.entries = [e for e in p.entries if e not in ended]
    known_oids = {e.oid for e in p.entries}
    joined, left_out = split_followable([t for oid, t in found.items() if oid not in known_oids])
    leave_out(left_out)
    if joined:
        p.entries += join(dialect, conn, joined, p.next_tid, {n for n, _ in p.ended})
        p.next_tid += len(joined)
    p.entries, p.next_tid, altered = compare_signatures(dialect, conn, p.entries, p.next_tid)
    p.changed = p.changed or bool(ended or joined or altered)


def plan_ready(dialect: CatalogDialect, conn: Any, p: Poll, generation: int, split_size: int) -> list[Split]:
    """The chunks of the joining tables whose time has come (see the module docstring), into ``p``."""
    waiting = [e for e in p.entries if e.state == "joining"]
    if not waiting:
        return []
    horizon = dialect.transaction_horizon(conn)
    # after_xid None: the dialect's log carried the table before the join (MySQL): no transaction to wait for.
    older_ended = [e for e in waiting if e.after_xid is None or horizon >= e.after_xid]
    read_up_to = dialect.unread_before(conn, [e.after_lsn for e in older_ended if e.after_lsn is not None])
    ready = [e for e in older_ended if e.after_lsn is None or e.after_lsn <= read_up_to]
    if not ready:
        return []
    out, planned = plan_chunks(dialect, conn, ready, generation, split_size)
    p.entries = [e.with_state("snapshot") if e.tid in planned else e for e in p.entries]
    p.changed = p.changed or bool(planned)
    return out


def renew(dialect: CatalogDialect, conn: Any, entries: list[TableEntry], next_tid: int,
          reasons: dict[int, str]) -> tuple[list[TableEntry], int, list[TableEntry]]:
    """``entries`` with those of ``reasons`` (oid -> why) replaced by joining ones under new tids (a re-snapshot:
    its chunks planned after the mark, bracketed by ``B``/``E``); returns the entries, the next tid, the new ones."""
    doomed = [e for e in entries if e.oid in reasons]
    if not doomed:
        return entries, next_tid, []
    # The signature first, then the mark: every statement the signature shows lies before the mark's position.
    sigs = dialect.signatures(conn, [e.oid for e in doomed])
    mark = dialect.join_mark(conn)
    new = []
    for e in doomed:
        if e.oid not in sigs:
            continue  # dropped meanwhile: the next poll ends it
        new.append(replace(e, tid=next_tid, state="joining", after_xid=mark.after_xid, after_lsn=mark.position,
                           signature=sigs[e.oid], reason=reasons[e.oid]))
        log.warning("%s: snapshotting %s again (tid %d -> %d): %s", dialect.component, e.name, e.tid, next_tid,
                    reasons[e.oid])
        next_tid += 1
    renewed = {e.oid for e in new}
    return [e for e in entries if e.oid not in renewed] + new, next_tid, new


def compare_signatures(dialect: CatalogDialect, conn: Any, entries: list[TableEntry],
                       next_tid: int) -> tuple[list[TableEntry], int, bool]:
    """Re-snapshot the tables whose catalog shows a change the log does not carry; record the signature where it
    changed otherwise, or where an older registry file has none. Returns the entries, the next tid, whether any changed."""
    now = dialect.signatures(conn, [e.oid for e in entries])
    reasons: dict[int, str] = {}
    out, altered = [], False
    for e in entries:
        sig = now.get(e.oid)
        if sig is not None and sig != e.signature:
            why = None if e.signature is None else dialect.signature_change(conn, e.signature, sig)
            if why is not None:
                reasons[e.oid] = why
            else:
                e, altered = replace(e, signature=sig), True
        out.append(e)
    if reasons:
        out, next_tid, _ = renew(dialect, conn, out, next_tid, reasons)
        altered = True
    return out, next_tid, altered


def join(dialect: CatalogDialect, conn: Any, tables: list[FoundTable], first_tid: int, reused: set[str]) -> list[TableEntry]:
    """Tables that joined while running: into the log (``follow``), then the mark; the mark's position matters for
    one that takes a name in ``reused`` (an ended entry's changes may still be unread)."""
    for t in tables:
        dialect.check_followable(t)
    dialect.follow(conn, tables)
    sigs = dialect.signatures(conn, [t.oid for t in tables])
    keys = dialect.primary_keys(conn, [t.oid for t in tables])
    # after_lsn for a table that takes the name of one followed before (dropped and created again, swapped in by
    # RENAME): the old table's last changes -- under the same name -- must not come after the new one's chunk rows.
    mark = dialect.join_mark(conn)
    return [TableEntry(first_tid + i, t.oid, t.schema, t.table, "joining", mark.after_xid, keys.get(t.oid, ()),
                       after_lsn=mark.position if t.name in reused else None, signature=sigs.get(t.oid))
            for i, t in enumerate(tables)]


def plan_chunks(dialect: CatalogDialect, conn: Any, entries: list[TableEntry], generation: int,
                split_size: int) -> tuple[list[Split], set[int]]:
    """The chunk splits of ``entries``, and the tids that got them (a table dropped or renamed since it
    was found gets none: the next poll ends its entry)."""
    out: list[Split] = []
    planned: set[int] = set()
    for e in entries:
        if dialect.table_name(conn, e.oid) != e.name:
            continue
        chunks = dialect.plan_chunks(conn, e, split_size)
        for n, (lo, hi) in enumerate(chunks.bounds):
            payload = {"tid": e.tid, "oid": e.oid, "table": e.name, "lo": lo, "hi": hi,
                       **({} if chunks.rows is None else {"rows": chunks.rows}), **chunks.fields,
                       "after_xid": e.after_xid,
                       # Bracketed (B ... E: the sink deletes the keys it lacks) after a lost slot, and
                       # always for a table that joins: a table dropped and created again under the same
                       # name, or swapped in by RENAME, replaces the old target's rows, never merges into them.
                       "resnapshot": generation > 0 or e.state == "joining"}
            out.append(Split(table_chunk_id(generation, e.tid, n), json.dumps(payload)))
        planned.add(e.tid)
    return out, planned
