"""Key lookup: an epoch's changed keys -> (data file, row position) of the table's live rows.

Format-independent: a format sink describes its live data files as :class:`CandidateFile`
(identity, where to read it, min/max of the first key column, the positions its deletes
already cover) and gets :class:`~flinkish_spark.connectors.lakehouse.resolve.Matches`.

Cost, and why it is shaped this way. Changes of a CDC stream hit random keys: 10,000
changes in a 10 M-row table touch about one row in 1,000, so every block of more than a
few thousand rows -- every data file, every row group -- holds one. Min/max pruning only
skips files whose key range the epoch misses (a snapshot's key-clustered chunks, new keys
above the table's range); for updates it keeps them all. Reading the key column of every
candidate file in each epoch would make the epoch's cost grow with the table. So:

* a data file is immutable: its keys are read once per process (only the key columns,
  and ``live_column`` where there is one), sorted into a compact index -- int64 codes
  for one integer/date/timestamp key, a 64-bit hash of the key otherwise (a hash match
  is then verified against the key values) -- and kept in an LRU cache bounded in bytes
  (:data:`DEFAULT_CACHE_BYTES`; an integer key costs 8 bytes per row of a key-sorted
  file -- what the sinks write -- and 16 of an unsorted one);
* a lookup is a binary search of the epoch's sorted keys in each candidate's index:
  O(changes x log rows) per file, no I/O once the index is warm;
* rows already deleted (``CandidateFile.deleted``: the current deletion vector, the
  position deletes) are dropped from the matches; they are read only for files with
  matches, and the caller caches them too;
* a cold index (first epoch after a start, a file written by another writer) is read
  by :data:`READ_THREADS` threads (pyarrow reads and decodes without the GIL).

It runs where the commit runs (the driver): the commit needs the table's newest version,
and it would redo the lookup there anyway after a concurrent commit. The driver's
commit process is long-lived (the same Python process commits every epoch), which is
what keeps the cache warm; see docs/lakehouse.md for the measured figures.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from flinkish_spark.connectors.lakehouse.resolve import Matches
from flinkish_spark.io.fileio import FileIO

DEFAULT_CACHE_BYTES = 1 << 30
READ_THREADS = 4
_HASH_MIX = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class CandidateFile:
    """A live data file of the table, as the lookup needs it."""

    path: str  # its identity in the table (what Matches name)
    url: str  # where the FileIO reads it
    size: int  # bytes; with url the identity of its cached index
    lower: Any = None  # min / max of the first key column (None: unknown, the file is searched)
    upper: Any = None
    deleted: Callable[[], np.ndarray] | None = None  # positions already deleted (sorted), read on demand


@dataclass
class FileKeys:
    """The sorted key index of one data file (immutable, so cached by its url and size)."""

    codes: np.ndarray  # sorted key codes of the live rows
    positions: np.ndarray | None  # row position of each code; None: position == index
    keys: pa.Table | None  # the key columns by position, when codes are hashes (to verify matches)
    nbytes: int


def exact_codes(key_types: Sequence[pa.DataType]) -> bool:
    """Whether a key of these types maps one-to-one onto int64 codes (else codes are hashes)."""
    if len(key_types) != 1:
        return False
    t = key_types[0]
    return (pa.types.is_integer(t) and t != pa.uint64()) or pa.types.is_date(t) or pa.types.is_timestamp(t)


def key_codes(columns: Sequence[pa.ChunkedArray | pa.Array]) -> np.ndarray:
    """int64 codes of a single integer/date/timestamp key, else uint64 hashes (no nulls expected)."""
    if exact_codes([c.type for c in columns]):
        col = columns[0]
        if pa.types.is_date32(col.type):
            col = col.cast(pa.int32())
        return np.asarray(col.cast(pa.int64()).to_numpy(), dtype=np.int64)
    import pandas as pd

    out = np.zeros(len(columns[0]), dtype=np.uint64)
    for col in columns:
        values = col.to_numpy(zero_copy_only=False)
        hashed = pd.util.hash_array(np.asarray(values, dtype=object) if values.dtype.kind in "OUSM" else values)
        out = out * _HASH_MIX ^ hashed.astype(np.uint64)
    return out


class KeyIndexCache:
    """Per-process LRU of :class:`FileKeys`, bounded by bytes."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Any, ...], FileKeys] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...]) -> FileKeys | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def put(self, key: tuple[Any, ...], value: FileKeys) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = value
            self._bytes += value.nbytes
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def forget(self, url_prefix: str) -> None:
        """Drop the indexes of files below ``url_prefix`` (a table deleted: new files may reuse names)."""
        with self._lock:
            for key in [k for k in self._entries if str(k[0]).startswith(url_prefix)]:
                self._bytes -= self._entries.pop(key).nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes


CACHE = KeyIndexCache()


class KeyLookup:
    """Find the live rows of keys in data files (see the module docstring)."""

    def __init__(self, io: FileIO, key: tuple[str, ...], live_column: str | None = None,
                 cache: KeyIndexCache = CACHE) -> None:
        self.io, self.key, self.live_column, self.cache = io, key, live_column, cache
        self.files_read = 0  # cold indexes built by the last find() (for tests and benchmarks)
        self.types: pa.Schema | None = None  # the query's key types: a file's keys are read as these

    def index(self, f: CandidateFile) -> FileKeys:
        cache_key = (f.url, f.size, self.key, self.live_column, self.types)
        found = self.cache.get(cache_key)
        if found is None:
            found = self._build(f)
            self.cache.put(cache_key, found)
        return found

    def _build(self, f: CandidateFile) -> FileKeys:
        columns = list(self.key) + ([self.live_column] if self.live_column else [])
        with self.io.fs.open(self.io.strip(f.url), "rb") as handle:
            table = pq.read_table(handle, columns=columns)
        return self._index(table)

    def seed(self, url: str, size: int, keys: pa.Table) -> None:
        """Cache the index of a file this process just wrote into the table, from its rows' key columns in row
        order (``keys``: exactly the file's, in the types the next epochs' changed keys will have), so that the
        next epoch's lookup does not read back the file the commit named -- every epoch's commit names a new
        file per changed table, whose cold index was a fifth of a many-table commit. Only without a
        ``live_column`` (the index then depends on the keys alone). The same index :meth:`_build` makes from
        the file: a lookup cannot tell them apart."""
        if self.live_column is not None:
            return
        self.types = pa.schema([pa.field(k, keys.schema.field(k).type) for k in self.key])
        self.cache.put((url, size, self.key, self.live_column, self.types), self._index(keys.select(list(self.key))))

    def _index(self, table: pa.Table) -> FileKeys:
        """The index of a file from its key columns (and ``live_column``), by row position."""
        keys = table.select(list(self.key))
        if self.types is not None and keys.schema != self.types:
            # Another writer's file may store the key in another type (Spark's INT96 timestamps read
            # back as ns, large_string): codes and hashes must be those of the query's values.
            keys = pa.table([pc.cast(keys.column(k), self.types.field(k).type, safe=False) for k in self.key],
                            schema=self.types)
        live = None
        for k in self.key:
            if keys.column(k).null_count:
                valid = pc.is_valid(keys.column(k))
                live = valid if live is None else pc.and_(live, valid)
        if self.live_column:
            flag = pc.fill_null(table.column(self.live_column), False)
            live = flag if live is None else pc.and_(live, flag)
        exact = exact_codes([c.type for c in keys.columns])
        if live is not None:
            where = np.flatnonzero(np.asarray(live.to_numpy(zero_copy_only=False), dtype=np.bool_))
            codes = key_codes([c.take(pa.array(where)) for c in keys.columns])
        else:
            where = None
            codes = key_codes(keys.columns)
        if where is None and len(codes) and bool(np.all(codes[1:] >= codes[:-1])):
            positions = None  # our own files are written sorted by key: no permutation to keep
        else:
            order = np.argsort(codes, kind="stable")
            codes = codes[order]
            positions = (order if where is None else where[order]).astype(np.int64)
        kept = None if exact else keys.combine_chunks()
        nbytes = codes.nbytes + (0 if positions is None else positions.nbytes) + (0 if kept is None else kept.nbytes)
        return FileKeys(codes, positions, kept, nbytes)

    def find(self, keys: pa.Table, files: Sequence[CandidateFile]) -> Matches:
        """Live rows of ``keys`` (unique, sorted by the key columns) in ``files``."""
        self.files_read = 0
        self.types = pa.schema([pa.field(k, keys.schema.field(k).type) for k in self.key])
        if keys.num_rows == 0 or not files:
            return Matches({})
        candidates = self._prune(keys, files)
        if not candidates:
            return Matches({})
        query = key_codes(keys.columns)
        order = np.argsort(query, kind="stable")
        query, query_index = query[order], order.astype(np.int64)
        # The indexes built here are held for this lookup: the cache may be smaller than they are.
        built: dict[int, FileKeys] = {}
        cold = [i for i, f in enumerate(candidates)
                if self.cache.get((f.url, f.size, self.key, self.live_column, self.types)) is None]
        self.files_read = len(cold)
        if len(cold) > 1:
            with ThreadPoolExecutor(min(READ_THREADS, len(cold))) as pool:
                built.update(zip(cold, pool.map(lambda i: self.index(candidates[i]), cold)))
        exact = exact_codes([c.type for c in keys.columns])
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for i, f in enumerate(candidates):
            index = built.pop(i, None) or self.index(f)
            positions, key_index = _search(index, query, query_index)
            if len(positions) and not exact:
                positions, key_index = _verify(index, keys, positions, key_index)
            if len(positions) and f.deleted is not None:
                deleted = f.deleted()
                if len(deleted):
                    keep = ~np.isin(positions, deleted)
                    positions, key_index = positions[keep], key_index[keep]
            if len(positions):
                order = np.argsort(positions, kind="stable")
                out[f.path] = (positions[order], key_index[order])
        return Matches(out)

    def _prune(self, keys: pa.Table, files: Sequence[CandidateFile]) -> list[CandidateFile]:
        """Files whose first-key-column range holds one of the keys (keys are sorted by it)."""
        first = keys.column(0)
        if exact_codes([first.type]):
            values: Any = key_codes([first])
        else:
            values = first.to_pylist()
        out = []
        for f in files:
            if f.lower is None or f.upper is None:
                out.append(f)
                continue
            try:
                lo = _as_code(f.lower, first.type) if isinstance(values, np.ndarray) else f.lower
                hi = _as_code(f.upper, first.type) if isinstance(values, np.ndarray) else f.upper
                if isinstance(values, np.ndarray):
                    hit = np.searchsorted(values, lo, "left") < np.searchsorted(values, hi, "right")
                else:
                    hit = bisect.bisect_left(values, lo) < bisect.bisect_right(values, hi)
            except (TypeError, ValueError, OverflowError):
                hit = True  # a statistic we cannot compare prunes nothing
            if hit:
                out.append(f)
        return out


def _as_code(value: Any, t: pa.DataType) -> int:
    """A min/max statistic (a Python value of the key's type) as the int64 code of :func:`key_codes`."""
    if pa.types.is_integer(t):
        return int(value)
    return int(key_codes([pa.array([value], t)])[0])


def _search(index: FileKeys, query: np.ndarray, query_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes = index.codes
    if len(codes) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if codes.dtype != query.dtype:
        query = query.astype(codes.dtype)
    lo = np.searchsorted(codes, query, "left")
    hi = np.searchsorted(codes, query, "right")
    count = hi - lo
    total = int(count.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    starts = np.cumsum(count) - count
    offsets = np.arange(total) - np.repeat(starts, count) + np.repeat(lo, count)
    positions = offsets if index.positions is None else index.positions[offsets]
    return positions.astype(np.int64), np.repeat(query_index, count)


def _verify(index: FileKeys, keys: pa.Table, positions: np.ndarray, key_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep hash matches whose key values are equal (a 64-bit hash may collide)."""
    assert index.keys is not None
    same: np.ndarray | None = None
    for name in keys.column_names:
        have = index.keys.column(name).take(pa.array(positions))
        want = keys.column(name).take(pa.array(key_index))
        eq = np.asarray(pc.fill_null(pc.equal(have, want), False).to_numpy(zero_copy_only=False), dtype=np.bool_)
        same = eq if same is None else same & eq
    assert same is not None
    return positions[same], key_index[same]
