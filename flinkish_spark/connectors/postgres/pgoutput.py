"""A small decoder of PostgreSQL's ``pgoutput`` logical replication messages (protocol version 1).

What it guarantees: :func:`decode_changes` turns the messages of whole transactions, as
``pg_logical_slot_peek_binary_changes(..., 'proto_version', '1', 'publication_names', ...)``
returns them, into row changes in WAL (= commit) order, each tagged with its transaction's
commit LSN and commit time. It is a pure function of the bytes: the same messages always
give the same rows, which is what makes a replayed epoch read the same changes.

Messages handled (see PostgreSQL's "Logical Replication Message Formats"): Begin ``B``,
Commit ``C``, Relation ``R``, Insert ``I``, Update ``U`` (with an old key ``K`` or old row
``O`` when the key changed or REPLICA IDENTITY FULL), Delete ``D``, Truncate ``T``; Origin
``O``, Type ``Y`` and logical Message ``M`` carry no row change and are skipped. Values
arrive as text (``t``), null (``n``) or "unchanged TOASTed value" (``u``). An update's ``u``
value is taken from its old row when the server sent one (``REPLICA IDENTITY FULL``); without
it the value stays :data:`UNCHANGED_TOAST`: the multi-table stream marks the column unchanged (a keyed
target keeps its value), the single-table one refuses the change.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Iterable, Iterator, Literal

ChangeOp = Literal["c", "u", "d"]

#: PostgreSQL timestamps count microseconds from 2000-01-01 00:00:00 UTC.
PG_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)
PG_EPOCH_US = 946_684_800_000_000  # PG_EPOCH in microseconds since 1970-01-01

#: A value the server did not send because it is an unchanged TOASTed value ('u').
UNCHANGED_TOAST = object()


class PgOutputError(ValueError):
    """The bytes are not a pgoutput message this decoder understands."""


@dataclass(frozen=True)
class Column:
    name: str
    type_oid: int
    is_key: bool
    type_mod: int = -1


@dataclass(frozen=True)
class Relation:
    relid: int
    namespace: str
    name: str
    replica_identity: str  # 'd' default (primary key), 'f' full, 'i' index, 'n' nothing
    columns: tuple[Column, ...]

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @functools.cached_property
    def key_positions(self) -> tuple[int, ...]:
        """The positions of the replica identity's columns (all of them under REPLICA IDENTITY FULL)."""
        return tuple(i for i, c in enumerate(self.columns) if c.is_key)


@dataclass(frozen=True)
class Begin:
    final_lsn: int  # LSN of the commit record: the transaction's position in commit order
    commit_ts_us: int  # microseconds since 1970-01-01 UTC
    xid: int


@dataclass(frozen=True)
class Commit:
    commit_lsn: int
    end_lsn: int
    commit_ts_us: int



@dataclass(frozen=True)
class RowMessage:
    kind: Literal["I", "U", "D"]
    relid: int
    new: tuple[object, ...] | None  # text values, None (null) or UNCHANGED_TOAST
    old: tuple[object, ...] | None  # old key ('K') or old row ('O'), when sent
    old_kind: Literal["K", "O"] | None


@dataclass(frozen=True)
class Truncate:
    relids: tuple[int, ...]
    #: (schema, table) of each relid whose Relation message came first (decode_changes fills it)
    tables: tuple[tuple[str, str], ...] = ()
    commit_lsn: int = 0  # set by decode_changes: its transaction's commit LSN and time
    commit_ts_us: int = 0


@dataclass(frozen=True)
class Skipped:
    kind: str


Message = Begin | Commit | Relation | RowMessage | Truncate | Skipped


@dataclass(frozen=True)
class Change:
    """One row change: ``values`` by column name (text, None or UNCHANGED_TOAST)."""

    op: ChangeOp
    relation: Relation
    values: dict[str, object]
    commit_lsn: int
    commit_ts_us: int
    seq: int  # ordinal of the change within its transaction (WAL order)
    #: an update that changed the row's key (it follows the 'd' of the old key): an unchanged TOASTed value
    #: in it belongs to the old key's row
    moved: bool = False


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise PgOutputError(f"message truncated: wanted {n} bytes at offset {self.pos} of {len(self.data)}")
        out = self.data[self.pos:end]
        self.pos = end
        return out

    def byte(self) -> str:
        return chr(self.take(1)[0])

    def int8(self) -> int:
        return self.take(1)[0]

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self.take(8))[0])

    def cstring(self) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise PgOutputError(f"unterminated string at offset {self.pos}")
        out = self.data[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return out

    def tuple_data(self) -> tuple[object, ...]:
        values: list[object] = []
        for _ in range(self.int16()):
            kind = self.byte()
            if kind == "n":
                values.append(None)
            elif kind == "u":
                values.append(UNCHANGED_TOAST)
            elif kind == "t":
                values.append(self.take(self.int32()).decode("utf-8"))
            elif kind == "b":
                raise PgOutputError("binary tuple values ('b') are not supported: do not ask for binary 'true'")
            else:
                raise PgOutputError(f"unknown tuple value kind {kind!r}")
        return tuple(values)


def _ts(pg_us: int) -> int:
    return pg_us + PG_EPOCH_US


def decode_message(data: bytes) -> Message:
    """Decode one pgoutput message (one row of ``pg_logical_slot_peek_binary_changes``)."""
    if not data:
        raise PgOutputError("empty message")
    r = _Reader(bytes(data))
    kind = r.byte()
    if kind == "B":
        return Begin(final_lsn=r.int64(), commit_ts_us=_ts(r.int64()), xid=r.uint32())
    if kind == "C":
        r.int8()  # flags, unused
        return Commit(commit_lsn=r.int64(), end_lsn=r.int64(), commit_ts_us=_ts(r.int64()))
    if kind == "R":
        relid = r.uint32()
        namespace, name = r.cstring(), r.cstring()
        identity = chr(r.int8())
        cols = []
        for _ in range(r.int16()):
            flags = r.int8()
            col_name = r.cstring()
            type_oid = r.uint32()
            type_mod = r.int32()
            cols.append(Column(col_name, type_oid, bool(flags & 1), type_mod))
        return Relation(relid, namespace, name, identity, tuple(cols))
    if kind == "I":
        relid = r.uint32()
        if r.byte() != "N":
            raise PgOutputError("insert message without a new tuple")
        return RowMessage("I", relid, r.tuple_data(), None, None)
    if kind == "U":
        relid = r.uint32()
        tag = r.byte()
        old: tuple[object, ...] | None = None
        old_kind: Literal["K", "O"] | None = None
        if tag in ("K", "O"):
            old_kind = "K" if tag == "K" else "O"
            old = r.tuple_data()
            tag = r.byte()
        if tag != "N":
            raise PgOutputError(f"update message: expected a new tuple 'N', got {tag!r}")
        return RowMessage("U", relid, r.tuple_data(), old, old_kind)
    if kind == "D":
        relid = r.uint32()
        tag = r.byte()
        if tag not in ("K", "O"):
            raise PgOutputError(f"delete message: expected an old key 'K' or row 'O', got {tag!r}")
        return RowMessage("D", relid, None, r.tuple_data(), "K" if tag == "K" else "O")
    if kind == "T":
        n = r.int32()
        r.int8()  # options (CASCADE / RESTART IDENTITY)
        return Truncate(tuple(r.uint32() for _ in range(n)))
    if kind in ("O", "Y", "M"):
        return Skipped(kind)
    raise PgOutputError(f"unknown pgoutput message type {kind!r}")


def relations_in(messages: Iterable[bytes]) -> dict[int, Relation]:
    """The Relation messages among ``messages`` by relid (the last one of each: its newest columns)."""
    relations: dict[int, Relation] = {}
    for data in messages:
        if data and data[0] == 82:  # "R" (an index, not a slice: this looks at every message of a peek)
            rel = decode_message(data)
            assert isinstance(rel, Relation)
            relations[rel.relid] = rel
    return relations


def decode_changes(
    messages: Iterable[bytes], start_lsn: int = 0, end_lsn: int | None = None
) -> Iterator[Change | Truncate]:
    """Row changes of the transactions whose commit LSN lies in ``[start_lsn, end_lsn)``.

    ``messages`` must begin at a transaction boundary (as a peek from a slot does). An
    update that changes the key yields a delete of the old key followed by an insert-like
    update of the new row, so that a keyed sink applying the rows in order ends right.
    Relation messages seen anywhere in the stream are remembered (the server sends one
    before a relation's first change in each decoding session, also in skipped transactions).
    """
    for item in raw_changes(messages, start_lsn, end_lsn):
        if isinstance(item, Truncate):
            yield item
        else:
            op, rel, values, lsn, ts, seq, moved = item
            yield Change(op, rel, dict(zip(rel.names, values)), lsn, ts, seq, moved)


#: A change as :func:`raw_changes` gives it: (op, relation, values in the relation's column order, commit LSN,
#: commit time, seq, moved) -- the fields of :class:`Change` without building its dict.
RawChange = tuple[ChangeOp, Relation, tuple[object, ...], int, int, int, bool]

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_I16 = struct.Struct(">h").unpack_from
_BEGIN = struct.Struct(">qq").unpack_from


def begin_final_lsn(data: bytes) -> int:
    """The commit LSN a Begin message (``data[:1] == b"B"``) announces, without decoding the rest: what planning
    reads of every transaction in a range (tens of thousands per epoch with many small transactions)."""
    if len(data) < 9:
        decode_message(data)  # says why
    return int(_BEGIN(data, 1)[0])


def _tuple_at(data: bytes, pos: int) -> tuple[tuple[object, ...], int]:
    """The TupleData at ``pos`` and the offset after it (what :meth:`_Reader.tuple_data` reads, without a method
    call per field: this runs for every column of every change)."""
    try:
        (n,) = _I16(data, pos)
        pos += 2
        values: list[object] = []
        add = values.append
        for _ in range(n):
            kind = data[pos]
            pos += 1
            if kind == 116:  # 't'
                (size,) = _I32(data, pos)
                pos += 4
                end = pos + size
                if end > len(data):
                    raise IndexError
                add(data[pos:end].decode("utf-8"))
                pos = end
            elif kind == 110:  # 'n'
                add(None)
            elif kind == 117:  # 'u'
                add(UNCHANGED_TOAST)
            elif kind == 98:  # 'b'
                raise PgOutputError("binary tuple values ('b') are not supported: do not ask for binary 'true'")
            else:
                raise PgOutputError(f"unknown tuple value kind {chr(kind)!r}")
    except (IndexError, struct.error):
        raise PgOutputError(f"message truncated: a tuple runs past the end of its {len(data)} bytes") from None
    return tuple(values), pos


@dataclass
class DecodeState:
    """Where :func:`raw_changes` stands between two slices of one message stream (a reader that decodes some
    stretches of the stream in bulk hands the rest to raw_changes slice by slice): the Relation messages seen,
    whether a transaction is open, its commit LSN and time, the ordinal of its next change and whether its
    changes are in the range."""

    relations: dict[int, Relation] = field(default_factory=dict)
    in_txn: bool = False
    lsn: int = 0
    ts: int = 0
    seq: int = 0
    wanted: bool = False


def raw_changes(messages: Iterable[bytes], start_lsn: int = 0,
                end_lsn: int | None = None, state: DecodeState | None = None) -> Iterator[RawChange | Truncate]:
    """:func:`decode_changes` as tuples (:data:`RawChange`), the same changes in the same order: for a reader that
    turns each change into a row right away and needs no :class:`Change` (nor its dict) on the way. The messages of
    Begin, Commit, Insert, Update and Delete are read here in place; the others by :func:`decode_message`.
    ``state``: where the previous slice of the same stream left off, updated when the messages are exhausted."""
    return _raw_changes(messages, start_lsn, end_lsn, DecodeState() if state is None else state)


def _raw_changes(messages: Iterable[bytes], start_lsn: int, end_lsn: int | None,
                 st: DecodeState) -> Iterator[RawChange | Truncate]:
    relations = st.relations
    in_txn, lsn, ts, seq, wanted = st.in_txn, st.lsn, st.ts, st.seq, st.wanted
    for data in messages:
        kind = data[:1]
        if kind == b"B":
            lsn, pg_ts = _BEGIN(data, 1)
            ts = pg_ts + PG_EPOCH_US
            in_txn, seq = True, 0
            wanted = lsn >= start_lsn and (end_lsn is None or lsn < end_lsn)
            continue
        if kind == b"C":
            in_txn = False
            continue
        if kind not in (b"I", b"U", b"D"):
            msg = decode_message(data)
            if isinstance(msg, Relation):
                relations[msg.relid] = msg
            elif isinstance(msg, Truncate):
                if not in_txn:
                    raise PgOutputError("a row change outside of a transaction (the messages do not start at a Begin)")
                if wanted:
                    # The server sends the Relation of each truncated table before the message.
                    yield Truncate(msg.relids, tuple((relations[r].namespace, relations[r].name) for r in msg.relids
                                                     if r in relations), lsn, ts)
            elif not isinstance(msg, Skipped):
                raise PgOutputError(f"unexpected {type(msg).__name__} message")
            continue
        if not isinstance(data, bytes):
            data = bytes(data)
        if len(data) < 6:
            decode_message(data)  # says why
        (relid,) = _U32(data, 1)
        tag = data[5]
        if kind == b"I":
            if tag != 78:  # 'N'
                raise PgOutputError("insert message without a new tuple")
            new, _ = _tuple_at(data, 6)
            op: ChangeOp = "c"
            old = None
            old_tag = 0
        elif kind == b"U":
            old, old_tag, pos = None, 0, 6
            if tag in (75, 79):  # 'K', 'O'
                old_tag = tag
                old, pos = _tuple_at(data, 6)
                if pos >= len(data):
                    raise PgOutputError("message truncated: an update without its new tuple")
                tag = data[pos]
                pos += 1
            if tag != 78:
                raise PgOutputError(f"update message: expected a new tuple 'N', got {chr(tag)!r}")
            new, _ = _tuple_at(data, pos)
            op = "u"
        else:
            if tag not in (75, 79):
                raise PgOutputError(f"delete message: expected an old key 'K' or row 'O', got {chr(tag)!r}")
            old, _ = _tuple_at(data, 6)
            new, op, old_tag = old, "d", tag
        if not in_txn:
            raise PgOutputError("a row change outside of a transaction (the messages do not start at a Begin)")
        if not wanted:
            continue
        rel = relations.get(relid)
        if rel is None:
            raise PgOutputError(f"change of relation {relid} before its Relation message")
        if op == "d":
            yield ("d", rel, new, lsn, ts, seq, False)
            seq += 1
            continue
        moved = False
        if old is not None:
            if old_tag == 75:
                # Default replica identity sends the old key only when the key changed.
                yield ("d", rel, old, lsn, ts, seq, False)
                seq += 1
                moved = True
            else:
                # REPLICA IDENTITY FULL: the old row is logged whole (its TOASTed values
                # flattened), while the new row still says 'u' for an out-of-line value the
                # update did not touch -- so the value is the old row's.
                new = _unchanged_from_old(new, old)
                keys = rel.key_positions
                if [old[i] for i in keys] != [new[i] for i in keys]:
                    yield ("d", rel, old, lsn, ts, seq, False)
                    seq += 1
        yield (op, rel, new, lsn, ts, seq, moved)
        seq += 1
    st.in_txn, st.lsn, st.ts, st.seq, st.wanted = in_txn, lsn, ts, seq, wanted


def _unchanged_from_old(new: tuple[object, ...], old: tuple[object, ...]) -> tuple[object, ...]:
    """``new`` with each unchanged TOASTed value ('u') replaced by the old row's value."""
    if UNCHANGED_TOAST not in new:
        return new
    return tuple(o if v is UNCHANGED_TOAST else v for v, o in zip(new, old))


def format_lsn(lsn: int) -> str:
    """``0/16B3748`` style, as PostgreSQL prints a pg_lsn."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    hi, sep, lo = text.partition("/")
    if not sep:
        raise ValueError(f"not an LSN: {text!r}")
    return (int(hi, 16) << 32) | int(lo, 16)
