"""The reading task's side of ``w`` packs (the source's ``decodeIn=sink``, :mod:`..rows.wire`): a piece of the change
stream framed with numpy, each change's pgoutput message shipped as it is.

Why: with many tables nearly every change is alone in its run of one table, so the per-message path (parse, a JSON
text per change) was the reading task's work -- ~1 s per 100,000 changes, serial, in the one task that reads the
slot. Here a piece costs a few dozen numpy calls plus one per table: the messages' kinds, their transactions'
commit LSN and time, which are wanted, each change's table and ``_seq``; the sink task that gets a table types
its messages (:func:`..rows.wire.wire_rows`).

What it guarantees: for a piece it takes, the stream carries what :meth:`.stream_rows._Stream.per_message` would
have made of it -- the same ``s`` rows (the same ``_lsn``, ``_seq``, ``_commit_ts``) and, per change of a followed
table, one row with the same ``_op``, ``_lsn``, ``_seq``, ``_commit_ts`` and values once typed -- and leaves
``DecodeState`` and the stream's counters as that path would. A piece qualifies when every message is a Begin,
Commit, Relation, Insert, Update without an old tuple or Delete, every change is inside a transaction after its
table's Relation message, no table is announced twice in the read (a schema change: the per-message path
writes its new ``s`` row in place), and no message carries a column the table's schema leaves out (the option
``transforms`` where no column list keeps it out of the publication: its values never leave the source task). Any other piece goes the old way after the pending ``w`` rows are flushed, so
within a table the stream stays in order. Pending rows are flushed every ``FLUSH_BATCHES * BATCH_ROWS`` changes or
``PACK_BYTES`` of messages (memory stays bounded whatever the read holds: one big transaction is millions of
changes), and a table's as soon as it has a whole pack (``PACK_ROWS``) pending, so that its sink task works while
this one reads on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.postgres.pgoutput import PG_EPOCH_US, DecodeState, Relation, decode_message
from flinkish_spark.connectors.postgres.rows.packed import PACK_BYTES, PACK_ROWS, PACKED_ARROW
from flinkish_spark.connectors.postgres.rows.schema import TableSchema
from flinkish_spark.connectors.postgres.rows.wire import wire_schema
from flinkish_spark.connectors.postgres.source import stream_rows
from flinkish_spark.connectors.postgres.source.bulk_rows import Messages, _be64

if TYPE_CHECKING:
    from flinkish_spark.connectors.postgres.source.stream_rows import _Stream

_B, _C, _R, _I, _U, _D = (ord(c) for c in "BCRIUD")
_N, _K, _O = (ord(c) for c in "NKO")
_TS = pa.timestamp("us", tz="UTC")
#: Pending changes are flushed as packs every this many batches' worth (or ``PACK_BYTES`` of messages): few packs per
#: table in an epoch of a many-table database (each pack costs its table's sink task a decode), memory bounded.
FLUSH_BATCHES = 4


@dataclass
class _Table:
    """One table's pending changes: its schema and Relation, its messages and their metadata, in stream order."""

    schema: TableSchema
    rel: Relation
    parts: list[tuple[pa.BinaryArray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    count: int = 0


class WireRows:
    """The ``w`` rows of a read not yet in a pack (per relid, tables in the order they first came)."""

    def __init__(self) -> None:
        self.tables: dict[int, _Table] = {}
        self.count = self.bytes = 0

    def piece(self, stream: "_Stream", messages: list[bytes], start: int, end: int,
              state: DecodeState) -> Iterator[pa.RecordBatch] | None:
        """The piece's output (its ``s`` rows; its changes pending here), or None: the piece goes the old way."""
        plan = _plan(stream, messages, start, end, state)
        if plan is None:
            return None
        return self._take(stream, plan, state)

    def _take(self, stream: "_Stream", plan: "_Plan", state: DecodeState) -> Iterator[pa.RecordBatch]:
        if len(stream.rows) or stream.parts_n:
            yield stream._flush()  # the rows the old way made before this piece: stream order within each table
        for relid, rel in plan.relations.items():
            state.relations[relid] = rel
        state.in_txn, state.lsn, state.ts, state.wanted, state.seq = plan.state_after
        for table, lsn, seq, ts, sid, text in plan.schema_rows:
            stream.rows.add(table, "s", lsn, seq, ts, sid, text)
        if len(stream.rows):
            yield stream._flush()
        stream.txn, stream.seq = plan.txn_after
        for relid, (schema, rel, msgs, lsns, seqs, tss) in plan.changes.items():
            stream.emitted[relid] = schema.schema_id  # its 's' row is out (now or earlier in the read)
            entry = self.tables.get(relid)
            if entry is None:
                entry = self.tables[relid] = _Table(schema, rel)
            entry.parts.append((msgs, lsns, seqs, tss))
            entry.count += len(msgs)
            self.count += len(msgs)
            self.bytes += msgs.nbytes
        if self.count >= FLUSH_BATCHES * stream_rows.BATCH_ROWS or self.bytes >= PACK_BYTES:
            yield from self.flush()
        else:
            # A table with a whole pack pending sends it now: its sink task starts on it while this task reads on
            # (a busy table's changes cross to the sink as they are read, not after the range). Only the piece's
            # tables can have filled one: the others were below it after the last piece.
            full = [relid for relid in plan.changes if self.tables[relid].count >= PACK_ROWS]
            if full:
                yield from self.flush(full)

    def flush(self, relids: list[int] | None = None) -> Iterator[pa.RecordBatch]:
        """The pending changes of ``relids`` (default: all), as ``w`` packs (a table's changes cut by ``PACK_ROWS``
        and ``PACK_BYTES``)."""
        if not self.tables:
            return
        rows: list[dict[str, Any]] = []
        for relid in list(self.tables) if relids is None else relids:
            t = self.tables.pop(relid)
            self.count -= t.count
            self.bytes -= sum(p[0].nbytes for p in t.parts)
            msgs = pa.concat_arrays([p[0] for p in t.parts]) if len(t.parts) > 1 else t.parts[0][0]
            lsns, seqs, tss = (np.concatenate([p[i] for p in t.parts]) for i in (1, 2, 3))
            per = max(1, min(PACK_ROWS, int(PACK_BYTES * len(msgs) // max(1, msgs.nbytes))))
            for a in range(0, len(msgs), per):
                b = min(len(msgs), a + per)
                rows.append(_pack(t, msgs.slice(a, b - a), lsns[a:b], seqs[a:b], tss[a:b]))
        yield pa.RecordBatch.from_pylist(rows, schema=PACKED_ARROW)


def _pack(t: _Table, msgs: pa.BinaryArray, lsns: np.ndarray, seqs: np.ndarray, tss: np.ndarray) -> dict[str, Any]:
    body = pa.RecordBatch.from_arrays(
        [msgs, pa.array(lsns, pa.int64()), pa.array(seqs.astype(np.int32), pa.int32()), pa.array(tss, pa.int64()).cast(_TS)],
        schema=wire_schema(t.rel.names))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, body.schema) as w:
        w.write(body)
    n = len(msgs)
    return {"_table": t.schema.table, "_op": "w", "_schema_id": t.schema.schema_id, "_lsn": int(lsns[0]),
            "_seq": int(seqs[0]), "_last_lsn": int(lsns[-1]), "_count": n, "_changes": n,
            "_commit_ts": int(tss.max()), "batch": sink.getvalue().to_pybytes()}


@dataclass(frozen=True)
class _Plan:
    """What a piece adds: Relation messages, ``s`` rows, each table's changes, and the counters after it."""

    relations: dict[int, Relation]
    schema_rows: list[tuple[str, int, int, int, str, str]]  # table, lsn, seq, ts, schema id, schema JSON
    changes: dict[int, tuple[TableSchema, Relation, pa.BinaryArray, np.ndarray, np.ndarray, np.ndarray]]
    state_after: tuple[bool, int, int, bool, int]  # DecodeState's in_txn, lsn, ts, wanted, seq
    txn_after: tuple[int, int]  # the stream's txn (commit LSN of the last change) and next _seq


def _plan(stream: "_Stream", messages: list[bytes], start: int, end: int, st: DecodeState) -> _Plan | None:
    """The piece's plan, or None when it does not qualify (see the module docstring). Changes nothing."""
    n = len(messages)
    if not n:
        return None
    m = Messages.of(messages)
    k, t = m.kinds, m.tags
    lens = m.ends - m.starts
    is_b, is_c, is_r = k == _B, k == _C, k == _R
    row = (k == _I) | (k == _U) | (k == _D)
    if not np.all(is_b | is_c | is_r | row) or int(lens.sum()) >= 1 << 31:
        return None
    if np.any(((k == _I) | (k == _U)) & (t != _N)) or np.any((k == _D) & (t != _K) & (t != _O)):
        return None  # an update with its old key or row (two rows, or a moved key), or a malformed message
    if np.any(row & (lens < 8)):
        return None
    begins = np.flatnonzero(is_b)
    if np.any(lens[begins] < 17):
        return None
    at = np.arange(n)
    last = np.maximum.accumulate(np.where(is_b | is_c, at, -1))
    in_txn = np.where(last < 0, st.in_txn, is_b[np.maximum(last, 0)])
    if np.any(row & ~in_txn):
        return None
    b_lsn = _be64(m.buf, m.starts[begins] + 1) if len(begins) else np.zeros(0, np.int64)
    b_ts = _be64(m.buf, m.starts[begins] + 9) + PG_EPOCH_US if len(begins) else np.zeros(0, np.int64)
    bi = np.searchsorted(begins, at, side="right") - 1
    lsn = np.where(bi < 0, st.lsn, b_lsn[np.maximum(bi, 0)] if len(begins) else 0)
    ts = np.where(bi < 0, st.ts, b_ts[np.maximum(bi, 0)] if len(begins) else 0)
    wanted = np.where(bi < 0, st.wanted, (lsn >= start) & (lsn < end))
    # Relation messages: each table announced once in the read (again: a schema change, the old path's)
    announced: dict[int, tuple[int, Relation]] = {}
    for i in np.flatnonzero(is_r).tolist():
        msg = decode_message(messages[i])
        if not isinstance(msg, Relation) or msg.relid in announced or msg.relid in stream.resolved:
            return None
        announced[msg.relid] = (i, msg)
    wrows = np.flatnonzero(row & wanted)
    relids = m.relids[wrows]
    uniq, first = np.unique(relids, return_index=True)
    rels: dict[int, Relation] = {}
    for relid, fi in zip(uniq.tolist(), first.tolist()):
        if relid in announced:
            if announced[relid][0] > wrows[fi]:
                return None  # a change before its Relation message: the old path says what is wrong
            rels[relid] = announced[relid][1]
        elif relid in st.relations:
            rels[relid] = st.relations[relid]
        else:
            return None
    # Every check passed: resolve the tables (the catalog was asked for the piece's relations already).
    schemas: dict[int, TableSchema | None] = {}
    for relid, rel in rels.items():
        entry = stream.resolved.get(relid)
        if entry is None or entry[0] is not rel:
            entry = stream._resolve_entry(rel)
        schemas[relid] = schema = entry[1]
        if schema is not None and not set(rel.names) <= set(schema.names):
            # The messages carry a column the option 'transforms' leaves out (no column list could keep it out of
            # the publication): its values must not leave this task, so the per-message path drops it.
            return None
    followed = np.array([schemas[r] is not None for r in relids.tolist()], bool) if len(relids) else np.zeros(0, bool)
    frows, frel = wrows[followed], relids[followed]
    f_lsn, f_ts = lsn[frows], ts[frows]
    # An 's' row before a table's first change in the read (or after its schema changed): it takes a _seq
    fuq, ffirst = np.unique(frel, return_index=True)
    first_flag = np.zeros(len(frows), np.int64)
    for relid, fi in zip(fuq.tolist(), ffirst.tolist()):
        schema = schemas[relid]
        assert schema is not None
        if stream.emitted.get(relid) != schema.schema_id:
            first_flag[fi] = 1
    slots = 1 + first_flag
    excl = np.cumsum(slots) - slots
    prev = np.concatenate([[stream.txn], f_lsn[:-1]]) if len(frows) else np.zeros(0, np.int64)
    new_txn = f_lsn != prev
    base = np.maximum.accumulate(np.where(new_txn, excl, -1)) if len(frows) else np.zeros(0, np.int64)
    seq = np.where(base < 0, stream.seq + excl, excl - np.maximum(base, 0))
    row_seq = seq + first_flag
    schema_rows = []
    for i in np.flatnonzero(first_flag).tolist():
        schema = schemas[int(frel[i])]
        assert schema is not None
        schema_rows.append((schema.table, int(f_lsn[i]), int(seq[i]), int(f_ts[i]), schema.schema_id, schema.to_json()))
    # The stream's counters after the piece, as per_message leaves them: the last wanted change's transaction
    # (a change of a table not followed starts a new transaction's count too, and takes no _seq) and the _seq
    # after the last followed change of that transaction -- in this piece, or before it.
    txn_after = (stream.txn, stream.seq)
    if len(wrows):
        last_lsn = int(lsn[wrows[-1]])
        if len(frows) and int(f_lsn[-1]) == last_lsn:
            txn_after = (last_lsn, int(row_seq[-1]) + 1)
        else:
            txn_after = (last_lsn, stream.seq if last_lsn == stream.txn else 0)
    changes: dict[int, tuple[TableSchema, Relation, pa.BinaryArray, np.ndarray, np.ndarray, np.ndarray]] = {}
    if len(frows):
        arr = m.as_array()  # the total was checked under 2 GiB above
        order = np.argsort(frel, kind="stable")
        taken = arr.take(pa.array(frows[order]))
        sorted_rel = frel[order]
        cuts = np.flatnonzero(sorted_rel[1:] != sorted_rel[:-1]) + 1
        bounds = np.concatenate([[0], cuts, [len(order)]]).tolist()
        groups = {int(sorted_rel[a]): (a, b) for a, b in zip(bounds[:-1], bounds[1:])}
        for relid in fuq[np.argsort(ffirst, kind="stable")].tolist():  # tables in the order they first came
            a, b = groups[relid]
            sel = order[a:b]
            schema = schemas[relid]
            assert schema is not None
            changes[relid] = (schema, rels[relid], taken.slice(a, b - a), f_lsn[sel], row_seq[sel], f_ts[sel])
    marks = np.flatnonzero(is_b | is_c)
    in_txn_after = bool(is_b[marks[-1]]) if len(marks) else st.in_txn
    if len(begins):
        lsn_after, ts_after = int(b_lsn[-1]), int(b_ts[-1])
        wanted_after = bool(start <= lsn_after < end)
        seq_after = int(np.count_nonzero(row[begins[-1]:])) if wanted_after else 0
    else:
        lsn_after, ts_after, wanted_after = st.lsn, st.ts, st.wanted
        seq_after = st.seq + (int(np.count_nonzero(row)) if st.wanted else 0)
    return _Plan({r: rel for r, (_, rel) in announced.items()}, schema_rows, changes,
                 (in_txn_after, lsn_after, ts_after, wanted_after, seq_after), txn_after)
