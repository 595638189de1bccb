"""Stream rows of a run of pgoutput row messages of one relation, decoded in bulk: column by column over all rows.

What it guarantees: for the messages it accepts, the rows (``_op``, ``_lsn``, ``_seq``, ``_commit_ts`` and the
``row`` JSON text) are byte for byte what the per-message path (:func:`..pgoutput.raw_changes` and
:meth:`..rows.RowEncoder.compile`) makes of them; whatever it does not handle -- an unchanged TOASTed value
(``u``), a binary or unknown value kind, a truncated message, bytes that are not UTF-8, an update that carries
its old key or row, a change outside a transaction -- makes it decline (None), and the caller takes the
per-message path, which then writes the row or raises the error it always raised.

Why it is fast: every Insert, Update (new tuple only) and Delete of one relation carries the same number of
columns, so the offsets of column k+1 in all messages follow from those of column k with one numpy expression
(kind byte ``n``/``t``, a 4-byte big-endian length after ``t``); the values of a column become one Arrow string
array (a gather of their bytes, no Python object per value) and the row's JSON text is joined by Arrow compute
from per-column pieces: a number's text as it is, a string quoted with JSON's escapes (backslash, quote and the
short control escapes by substring replacement, any other control character by the json module per value), a
bool as ``true``/``false``, ``null``; the rarer encodings (bytea, arrays) by their Python encoder, per value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.postgres.pgoutput import PG_EPOCH_US, DecodeState
from flinkish_spark.connectors.postgres.rows.encode import _json_string, value_encoder
from flinkish_spark.connectors.postgres.rows.schema import Column, TableSchema, arrow_type
from flinkish_spark.connectors.postgres.rows.typed import typed_column

_B, _C, _I, _U, _D = (ord(c) for c in "BCIUD")
_N, _K, _O = (ord(c) for c in "NKO")
#: control characters json writes as a short escape (the others as \\u00XX)
_SHORT_ESCAPES = {8: "\\b", 9: "\\t", 10: "\\n", 12: "\\f", 13: "\\r"}
#: A tuple, not a module-level ``pa.array``: building an Arrow array imports pandas (pyarrow's shim), which every
#: Python worker importing the source (the planning ones included) would then pay for.
_OPS = ("c", "u", "d")


class Declined(Exception):
    """The bulk path does not handle these messages: the per-message path does (and says what is wrong)."""


@dataclass(frozen=True)
class Messages:
    """The messages of one peek as one buffer: where each starts and ends, its kind, the tag after its relid
    and its relid (row messages)."""

    buf: np.ndarray  # uint8
    starts: np.ndarray  # int64
    ends: np.ndarray
    kinds: np.ndarray  # uint8
    tags: np.ndarray  # uint8: byte 5 (0 where the message is shorter)
    relids: np.ndarray  # int64: bytes 1-4 big-endian (0 where the message is shorter)

    @classmethod
    def of(cls, messages: Sequence[bytes]) -> Messages:
        lens = np.fromiter(map(len, messages), np.int64, len(messages))
        ends = np.cumsum(lens)
        buf = np.frombuffer(b"".join(messages) + b"\x00" * 16, np.uint8)  # padded: reads past a short message stay in
        return cls._framed(buf, ends - lens, ends)

    @classmethod
    def _framed(cls, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Messages:
        lens = ends - starts
        kinds = np.where(lens > 0, buf[starts], 0).astype(np.uint8)
        tags = np.where(lens > 5, buf[starts + 5], 0).astype(np.uint8)
        relids = np.where(lens > 5, _be32(buf, starts + 1), 0)
        return cls(buf, starts, ends, kinds, tags, relids)

    @classmethod
    def of_array(cls, msgs: pa.BinaryArray) -> Messages:
        """The messages of an Arrow binary array (a ``w`` pack's, :mod:`..rows.wire`): their bytes copied once."""
        offsets = np.frombuffer(msgs.buffers()[1], np.int32, len(msgs) + 1, msgs.offset * 4).astype(np.int64)
        data = msgs.buffers()[2]
        lo, hi = int(offsets[0]), int(offsets[-1])
        raw = np.frombuffer(data, np.uint8, hi - lo, lo) if data is not None and hi > lo else np.zeros(0, np.uint8)
        buf = np.concatenate([raw, np.zeros(16, np.uint8)])  # padded, as of() pads
        return cls._framed(buf, offsets[:-1] - lo, offsets[1:] - lo)

    def as_array(self) -> pa.BinaryArray:
        """The messages as one Arrow binary array over the same bytes (no copy); its offsets are 32-bit, so the
        caller checks the total is under 2 GiB."""
        offsets = np.concatenate([self.starts, self.ends[-1:]]).astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), len(self.starts), [None, pa.py_buffer(offsets), pa.py_buffer(self.buf)])

    def runs(self, min_rows: int, max_rows: int) -> list[tuple[int, int]]:
        """Message ranges [a, b) the bulk path may take: Begin, Commit and row messages without an old tuple of one
        relation, at least ``min_rows`` of the latter (fewer are not worth the fixed cost of a bulk decode) and at
        most ``max_rows`` (a longer stretch is cut: a run's arrays stay the size of a batch)."""
        k, t = self.kinds, self.tags
        row = (((k == _I) | (k == _U)) & (t == _N)) | ((k == _D) & ((t == _K) | (t == _O)))
        ok = row | (k == _B) | (k == _C)
        rows_at = np.flatnonzero(row)
        # a break before a message that may not be in a run, and before a row of another relation than the row before
        brk = ~ok
        other = rows_at[1:][self.relids[rows_at[1:]] != self.relids[rows_at[:-1]]]
        brk[other] = True
        cuts = np.concatenate([[0], np.flatnonzero(brk), np.flatnonzero(brk) + 1, [len(k)]])
        cuts = np.unique(cuts)
        counts = np.concatenate([[0], np.cumsum(row)])
        out: list[tuple[int, int]] = []
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            if b > a and ok[a] and counts[b] - counts[a] >= min_rows:
                heads = rows_at[counts[a]:counts[b]:max_rows].tolist()  # the first row of each part
                bounds = [a] + heads[1:] + [b]
                out.extend(zip(bounds[:-1], bounds[1:]))
        return out


def _be32(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The unsigned 32-bit big-endian integers at ``at`` (a relid, a length), as int64."""
    return np.lib.stride_tricks.sliding_window_view(buf, 4)[at].copy().view(">u4").ravel().astype(np.int64)


def _be64(buf: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.lib.stride_tricks.sliding_window_view(buf, 8)[at].copy().view(">i8").ravel().astype(np.int64)


@dataclass(frozen=True)
class Positions:
    """Where a run's wanted row messages are and what their transactions are (the output's metadata)."""

    msgs: np.ndarray  # message indices of the wanted rows, in stream order
    lsns: np.ndarray
    ts: np.ndarray


def locate(m: Messages, a: int, b: int, state: DecodeState, start: int, end: int) -> Positions:
    """The wanted row messages of the run [a, b) and their commit LSN and time; ``state`` moves past the run
    (what :func:`..pgoutput.raw_changes` would leave in it)."""
    k = m.kinds[a:b]
    marks = np.flatnonzero((k == _B) | (k == _C))
    is_row = (k != _B) & (k != _C)
    # the last Begin/Commit before each message (-1: none in the run, the state's transaction)
    last = np.full(b - a, -1, np.int64)
    last[marks] = marks
    last = np.maximum.accumulate(last)
    begins = np.flatnonzero(k == _B)
    b_lsn = _be64(m.buf, m.starts[a + begins] + 1) if len(begins) else np.zeros(0, np.int64)
    b_ts = _be64(m.buf, m.starts[a + begins] + 9) + PG_EPOCH_US if len(begins) else np.zeros(0, np.int64)
    if len(begins) and np.any(m.ends[a + begins] - m.starts[a + begins] < 17):
        raise Declined("a short Begin")
    # per message: its transaction's LSN and time, and whether it is in one
    bi = np.searchsorted(begins, np.arange(b - a), side="right") - 1  # the last Begin at or before
    in_txn = np.where(last < 0, state.in_txn, k[np.maximum(last, 0)] == _B)
    if len(begins):
        at = np.maximum(bi, 0)
        lsn = np.where(bi < 0, state.lsn, b_lsn[at])
        ts = np.where(bi < 0, state.ts, b_ts[at])
        wanted = np.where(bi < 0, state.wanted, (lsn >= start) & (lsn < end))
    else:
        lsn = np.full(b - a, state.lsn, np.int64)
        ts = np.full(b - a, state.ts, np.int64)
        wanted = np.full(b - a, state.wanted)
    if np.any(is_row & ~in_txn):
        raise Declined("a change outside a transaction")
    sel = np.flatnonzero(is_row & wanted)
    # the state after the run, as raw_changes leaves it
    if len(marks):
        state.in_txn = bool(k[marks[-1]] == _B)
    if len(begins):
        state.lsn, state.ts = int(b_lsn[-1]), int(b_ts[-1])
        state.wanted = bool(start <= state.lsn < end)
        state.seq = int(np.count_nonzero(is_row[begins[-1]:])) if state.wanted else 0
    elif state.wanted:
        state.seq += int(np.count_nonzero(is_row))
    return Positions(sel + a, lsn[sel], ts[sel])


def seqs(lsns: np.ndarray, txn: int, seq: int) -> tuple[np.ndarray, int, int]:
    """The ``_seq`` of rows with these LSNs after a row of ``txn`` numbered ``seq - 1`` (a new LSN starts at 0),
    and the (txn, seq) after them."""
    n = len(lsns)
    idx = np.arange(n, dtype=np.int64)
    prev = np.concatenate([[txn], lsns[:-1]])
    first = np.maximum.accumulate(np.where(lsns != prev, idx, -1))
    out = np.where(first < 0, seq + idx, idx - first)
    return out, int(lsns[-1]), int(out[-1]) + 1


@dataclass(frozen=True)
class _Values:
    present: np.ndarray  # bool: 't'
    starts: np.ndarray
    sizes: np.ndarray


def columns(m: Messages, msgs: np.ndarray, ncols: int) -> list[_Values]:
    """Where each column's value is in each message (the TupleData at offset 6 of Insert/Update/Delete)."""
    buf, ends = m.buf, m.ends[msgs]
    pos = m.starts[msgs] + 6
    if np.any(pos + 2 > ends):
        raise Declined("short")
    n = (buf[pos].astype(np.int64) << 8) | buf[pos + 1]
    if np.any(n != ncols):
        raise Declined("another column count")
    pos = pos + 2
    out = []
    for _ in range(ncols):
        if np.any(pos >= ends):
            raise Declined("truncated")
        kind = buf[pos]
        t = kind == 116
        if not np.all(t | (kind == 110)):
            raise Declined("u, b or an unknown kind")
        size = np.where(t, _be32(buf, np.where(t, pos + 1, 0)), 0)
        vstart = pos + 5
        nxt = np.where(t, vstart + size, pos + 1)
        if np.any(nxt > ends) or np.any(size >= 1 << 31):
            raise Declined("truncated")
        out.append(_Values(t, vstart, size))
        pos = nxt
    return out


def _strings(buf: np.ndarray, v: _Values) -> tuple[pa.Array, np.ndarray]:
    """The values as an Arrow string array (null where not sent as text) and their bytes.

    Built as a string_view array whose views point into the messages' buffer (16 bytes a value: its length and
    either the value itself, up to 12 bytes, or its first 4 bytes and offset), which Arrow's cast then copies
    into a plain string array: no index per byte, as a gather with numpy would need."""
    n = len(v.starts)
    sizes64 = np.where(v.present, v.sizes, 0)
    if int(sizes64.sum()) >= 1 << 31:
        raise Declined("more than 2 GiB of text in a column")  # a string array's offsets are 32-bit
    sizes = sizes64.astype(np.int32)
    starts = np.where(v.present, v.starts, 0)
    views = np.empty((n, 16), np.uint8)
    # the 12 bytes from each value's start (the buffer is padded: they exist), zeroed past a short value's end
    views[:, 4:] = np.lib.stride_tricks.sliding_window_view(buf, 12)[starts]
    views[:, 4:] *= np.arange(12, dtype=np.int32)[None, :] < sizes[:, None]
    words = views.view(np.int32)  # (n, 4), little-endian as Arrow's views are
    words[:, 0] = sizes
    out_of_line = sizes > 12
    if out_of_line.any():
        words[out_of_line, 2] = 0  # buffer 0: the messages
        words[out_of_line, 3] = starts[out_of_line]
    validity = None if v.present.all() else pa.py_buffer(np.packbits(v.present, bitorder="little"))
    arr = pa.Array.from_buffers(pa.string_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(buf)])
    arr = arr.cast(pa.string())
    try:
        arr.validate(full=True)  # UTF-8: the per-message path raises for bytes that are not
    except pa.ArrowInvalid:
        raise Declined("not UTF-8") from None
    data = arr.buffers()[2]
    return arr, np.zeros(0, np.uint8) if data is None else np.frombuffer(data, np.uint8, int(sizes.sum()))


#: A piece of the row's JSON: text before the column's values, the values (their JSON, ``null`` included), text after.
Piece = tuple[str, pa.Array, str]


def _piece(buf: np.ndarray, col: Column, v: _Values) -> Piece:
    """The column's JSON value of each row, as :func:`..rows.encode.value_encoder` writes it. A string column
    without nulls leaves its quotes to the literal text around it (one pass less)."""
    nulls = not v.present.all()
    if col.encoding == "bool":
        first = buf[np.where(v.present, v.starts, 0)]
        if np.all(~v.present | ((v.sizes == 1) & ((first == ord("t")) | (first == ord("f"))))):
            # 't' or 'f' (what PostgreSQL sends): no text to decode or check
            piece = pc.if_else(pa.array(first == ord("t")), "true", "false")
            return "", pc.if_else(pa.array(v.present), piece, "null") if nulls else piece, ""
    arr, data = _strings(buf, v)
    if col.encoding == "number":
        piece = arr
    elif col.encoding == "bool":
        piece = pc.if_else(pc.equal(arr, "t"), "true", "false")
        piece = pc.if_else(pa.array(v.present), piece, pa.scalar(None, pa.string()))
    elif col.encoding == "string":
        escaped = _json_escaped(arr, data)
        if escaped is None:
            piece = pa.array([None if s is None else _json_string(s) for s in arr.to_pylist()], pa.string())
        elif not nulls:
            return '"', escaped, '"'
        else:
            piece = pc.binary_join_element_wise('"', escaped, '"', "")
    else:  # bytea, arrays: their Python encoder, per value
        enc = value_encoder(col)
        piece = pa.array([None if s is None else enc(s) for s in arr.to_pylist()], pa.string())
    return "", pc.fill_null(piece, "null") if nulls else piece, ""


def _json_escaped(arr: pa.Array, data: np.ndarray) -> pa.Array | None:
    """What ``json.dumps(v, ensure_ascii=False)`` writes between the quotes of each value (null stays null); None
    when a control character without a short escape is among the bytes (the json module writes those)."""
    ctl = data < 32
    if np.any(ctl) and not np.all(np.isin(data[ctl], list(_SHORT_ESCAPES))):
        return None
    if np.any(data == 92):
        arr = pc.replace_substring(arr, "\\", "\\\\")
    if np.any(data == 34):
        arr = pc.replace_substring(arr, '"', '\\"')
    if np.any(ctl):
        for byte, esc in _SHORT_ESCAPES.items():
            if np.any(data == byte):
                arr = pc.replace_substring(arr, chr(byte), esc)
    return arr


def rows_json(m: Messages, msgs: np.ndarray, rel_names: Sequence[str], schema: TableSchema,
              names: Sequence[str] | None) -> pa.Array:
    """The row JSON of each message: :meth:`..rows.RowEncoder.compile` ``(rel_names, names)`` of its values."""
    vals = columns(m, msgs, len(rel_names))
    index = {n: i for i, n in enumerate(rel_names)}
    by_name = {c.name: c for c in schema.columns}
    parts: list[Any] = []
    lit = "{"
    for j, name in enumerate(names if names is not None else schema.names):
        lit += ("," if j else "") + _json_string(name) + ":"
        i = index.get(name)
        if i is None:
            lit += "null"  # a column the values lack is null, as in compile
            continue
        before, values, after = _piece(m.buf, by_name[name], vals[i])
        parts.append(lit + before)
        parts.append(values)
        lit = after
    parts.append(lit + "}")
    if len(parts) == 1:
        return pa.array([parts[0]] * len(msgs), pa.string())
    return pc.binary_join_element_wise(*parts, "")


def typed_columns(m: Messages, msgs: np.ndarray, rel_names: Sequence[str], schema: TableSchema,
                  is_del: np.ndarray) -> list[pa.Array]:
    """The schema's columns of the row messages ``msgs`` (carrying ``rel_names``, in that order), typed column by
    column as the JSON shape decodes them (:func:`..rows.typed.typed_column`); a delete's columns but its key null;
    a column the messages lack null. Raises Declined (see :func:`columns`)."""
    n = len(msgs)
    vals = columns(m, msgs, len(rel_names))
    index = {name: i for i, name in enumerate(rel_names)}
    key = set(schema.key)
    masked = pa.array(is_del) if schema.key and is_del.any() else None  # a delete carries its key only
    typed = []
    for col in schema.columns:
        i = index.get(col.name)
        if i is None:
            typed.append(pa.nulls(n, arrow_type(col.spark_type)))
            continue
        arr = typed_column(_strings(m.buf, vals[i])[0], col)
        if masked is not None and col.name not in key:
            arr = pc.if_else(masked, pa.scalar(None, arr.type), arr)
        typed.append(arr)
    return typed


def encode_ops(m: Messages, msgs: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``_op`` of each message and which are deletes."""
    k = m.kinds[msgs]
    code = np.where(k == _I, 0, np.where(k == _U, 1, 2))
    return pa.array(_OPS, pa.string()).take(pa.array(code.astype(np.int8))), k == _D


