"""The keyed target's per-process view of its table: the live files (with their deletion vectors), and vectors read.

Both are kept for the life of the driver's commit process (Spark runs every commit of a
query in the same long-lived Python process, and keeps it across queries): the state is brought
up to date by reading only the commits written since (O(new commits) per epoch), a vector is read
once per (file, vector) and the target remembers the vectors it writes itself. Only a file's
newest vector is kept (a commit reads the vector the live file names, which a later one
replaces), least recently used first out past :data:`DV_CACHE_BYTES`, its size kept as a running
count: a store costs O(1) however long the process has run. A metadata or
protocol change of the table drops the state: the table is validated again and the
state reloaded from its newest checkpoint. A table deleted and created again at the path
(found by :meth:`DeltaTarget.check_same_table` at each batch's start and on every
call of :func:`table_state`, one GET) drops every cache of it:
the states of all uids, the vectors, and the key indexes of its files -- the new table's
files may reuse names the sink writes deterministically (an epoch's DV file, ``driver-copy-0000``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from flinkish_spark.connectors.delta.deletion_vectors import read_vector
from flinkish_spark.connectors.delta.log import TableChanged
from flinkish_spark.connectors.delta.state import DeltaState, LiveFile, load_state
from flinkish_spark.connectors.delta.state_table import load_validated
from flinkish_spark.connectors.delta.table import DATA_PREFIX, DeltaTarget
from flinkish_spark.connectors.lakehouse.files import epoch_dir
from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

DV_CACHE_BYTES = 256 << 20
#: What an entry costs besides its positions (key, tuple, array header): counted, so that millions of
#: tiny vectors are bounded too.
DV_ENTRY_BYTES = 256

_STATES: dict[tuple[str, str, str], DeltaState] = {}
_STATES_LOCK = threading.Lock()
#: ``table_uri|path`` -> (the vector's unique id, its positions): the file's newest vector this process saw.
_DV_CACHE: OrderedDict[str, tuple[str, np.ndarray]] = OrderedDict()
_DV_BYTES = 0  # sum of _cost over _DV_CACHE, under _DV_LOCK
_DV_LOCK = threading.Lock()


def table_state(target: DeltaTarget) -> DeltaState:
    """The sink's view of the table, loaded once per process, brought up to date on each call."""
    key = target._head_key()
    with _STATES_LOCK:
        state = _STATES.get(key)
    if state is not None and (target._head() is None or not target.check_same_table()):
        # Not confirmed to be the table on storage (another table is there now: check_same_table
        # dropped every cache of the old one; or the head it is checked by was dropped): read afresh.
        forget_state(target)
        state = None
    if state is not None:
        try:
            state.catch_up(target.log())
        except TableChanged:
            forget_state(target)
            return table_state(target)
        return state
    # From the log without delta-rs (whose load lists every version the table ever had), if it can.
    state = load_validated(target, "flinkish.delta commit")
    if state is None:
        table = target.validate(False, "flinkish.delta commit")
        target.set_head(table)  # what the next call checks the state's table by
        try:
            state = load_state(target.log(), table.version())
        except TableChanged:
            return table_state(target)  # changed again while loading: validate the newer version
    with _STATES_LOCK:
        _STATES[key] = state
    return state


def forget_state(target: DeltaTarget, table_too: bool = False) -> None:
    """Drop the uid's state; ``table_too``: another table is at the path now (deleted, created again),
    whose files can reuse names the sink writes deterministically (``driver-copy-0000`` below an
    epoch's folder, a vector at the same offset of the epoch's DV file): drop every cache of the old
    table -- every uid's state and head, the delta-rs table, the vectors and the key indexes."""
    with _STATES_LOCK:
        _STATES.pop(target._head_key(), None)
        if table_too:
            for state_key in [k for k in _STATES if k[:2] == target._key()]:
                _STATES.pop(state_key)
    target._forget_head(table_too)
    if table_too:
        CACHE.forget(target.url(""))
        _forget_vectors(f"{target.table_uri}|")


def deleted_positions(target: DeltaTarget, f: LiveFile) -> np.ndarray:
    """The positions a live file's deletion vector covers (cached by the vector's unique id)."""
    if f.dv is None:
        return np.zeros(0, dtype=np.int64)
    key = f"{target.table_uri}|{f.path}"
    with _DV_LOCK:
        found = _DV_CACHE.get(key)
        if found is not None and found[0] == f.dv.unique_id:
            _DV_CACHE.move_to_end(key)
            return found[1]

    def read_range(where: str, start: int, end: int) -> bytes:
        location = where if f.dv is not None and f.dv.storage_type == "p" else target.url(where)
        return bytes(target.io.fs.cat_file(target.io.strip(location), start=start, end=end))

    positions = read_vector(f.dv, read_range)
    _remember_dv(key, f.dv.unique_id, positions)
    return positions


def remember_dv(target: DeltaTarget, path: str, unique_id: str, positions: np.ndarray) -> None:
    """Keep the positions of a vector this process wrote (no need to read it back)."""
    _remember_dv(f"{target.table_uri}|{path}", unique_id, positions)


def vector_cache_bytes() -> int:
    """What the cached vectors count for against :data:`DV_CACHE_BYTES`."""
    with _DV_LOCK:
        return _DV_BYTES


def _cost(positions: np.ndarray) -> int:
    return int(positions.nbytes) + DV_ENTRY_BYTES


def _remember_dv(key: str, unique_id: str, positions: np.ndarray) -> None:
    global _DV_BYTES
    with _DV_LOCK:
        replaced = _DV_CACHE.pop(key, None)  # the file's older vector: a commit never asks for it again
        if replaced is not None:
            _DV_BYTES -= _cost(replaced[1])
        _DV_CACHE[key] = (unique_id, positions)
        _DV_BYTES += _cost(positions)
        while _DV_BYTES > DV_CACHE_BYTES and len(_DV_CACHE) > 1:
            _, (_, old) = _DV_CACHE.popitem(last=False)
            _DV_BYTES -= _cost(old)


def _forget_vectors(prefix: str = "") -> None:
    """Drop the cached vectors whose key starts with ``prefix`` (all of them: ``""``)."""
    global _DV_BYTES
    with _DV_LOCK:
        for dv_key in [k for k in _DV_CACHE if k.startswith(prefix)]:
            _DV_BYTES -= _cost(_DV_CACHE.pop(dv_key)[1])


class LiveTarget(DeltaTarget):
    """A target whose keyed mode (``plan``) answers from this module's per-process state: what the table
    holds, its newest version, and -- for a table recreated at the path -- every cache to drop.
    ``flinkish.delta``'s one-table sink and each routed target are one."""

    def committed(self, epoch: int) -> bool:
        if self.plan is not None:
            return table_state(self).txn(self.uid) >= epoch
        return super().committed(epoch)

    def newest_version(self) -> int:
        if self.plan is not None:
            return table_state(self).version
        return super().newest_version()

    def forget_table(self) -> None:
        forget_state(self, table_too=True)  # the keyed state, vectors and key indexes too

    def cleanup_epoch(self, epoch: int, kept: set[str]) -> None:
        """Delete the files of the epoch's folder that neither the table's commit of the epoch added, nor
        -- keyed, once the table holds the epoch -- the table names now, nor (before) ``kept`` names
        (relative paths). Nothing when the table holds the epoch but its commit cannot be read."""
        folder = epoch_dir(self.path, DATA_PREFIX, self.uid, epoch)
        on_storage = self.io.find(folder)
        if not on_storage:
            return
        named = self.added_by_table(epoch)
        if named is None:
            # The table holds the epoch but its commit cannot be read (log cleanup): deleting
            # by listing could remove committed data. Leave the folder.
            return
        root = self.io.strip(self.path).rstrip("/") + "/"
        state = table_state(self) if self.plan is not None else None
        if state is not None and state.txn(self.uid) >= epoch:
            # Keyed: the commit left out files whose rows all lost, and wrote files of its own
            # (vectors, copies, compactions): what the table names now or the epoch's version
            # named stays (a compaction right after the epoch may have removed some, but a reader
            # of the epoch's version still reads them: VACUUM's job), nothing else -- whatever the
            # decision says.
            wanted = {name for f in state.files.values() for name in f.stored_files()} | named
        else:
            wanted = named | kept
        self.io.delete_many([self.io.url(p) for p in on_storage if p[len(root):] not in wanted])
        self.io.remove_empty_dirs(folder)
