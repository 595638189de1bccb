"""The keyed target's per-process view of its table: the live files (with their deletion vectors), and vectors read.

Both are kept for the life of the driver's commit process (Spark runs every commit of a
query in the same long-lived Python process): the state is brought up to date by reading
only the commits written since (O(new commits) per epoch), a vector is read once per
(file, vector) and the target remembers the vectors it writes itself. A metadata or
protocol change of the table drops the state: the table is validated again and the
state reloaded from its newest checkpoint.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from flinkish_spark.connectors.delta.deletion_vectors import read_vector
from flinkish_spark.connectors.delta.log import TableChanged
from flinkish_spark.connectors.delta.state import DeltaState, LiveFile, load_state
from flinkish_spark.connectors.delta.table import DeltaTarget

DV_CACHE_BYTES = 256 << 20

_STATES: dict[tuple[str, str, str], DeltaState] = {}
_STATES_LOCK = threading.Lock()
_DV_CACHE: OrderedDict[str, np.ndarray] = OrderedDict()
_DV_LOCK = threading.Lock()


def table_state(target: DeltaTarget) -> DeltaState:
    """The sink's view of the table, loaded once per process, brought up to date on each call."""
    key = target._head_key()
    with _STATES_LOCK:
        state = _STATES.get(key)
    if state is None:
        table = target.validate(False, "flinkish.delta commit")
        try:
            state = load_state(target.log(), table.version())
        except TableChanged:
            return table_state(target)  # changed again while loading: validate the newer version
        with _STATES_LOCK:
            _STATES[key] = state
    else:
        try:
            state.catch_up(target.log())
        except TableChanged:
            forget_state(target)
            return table_state(target)
        if not target.still_there(state.version):
            forget_state(target, table_too=True)  # deleted (and created again?) since: read it afresh
            return table_state(target)
        state.fresh = False
    return state


def forget_state(target: DeltaTarget, table_too: bool = False) -> None:
    """Drop the uid's state; ``table_too``: the table itself may be another one now (deleted, created
    again), whose files can reuse names the sink writes deterministically (``driver-copy-0000``
    below an epoch's folder, a vector at the same offset of the epoch's DV file): drop every cache
    of its files too."""
    with _STATES_LOCK:
        _STATES.pop(target._head_key(), None)
    target._forget_head(table_too)
    if table_too:
        from flinkish_spark.connectors.lakehouse.key_lookup import CACHE

        CACHE.forget(target.url(""))
        with _DV_LOCK:
            for key in [k for k in _DV_CACHE if k.startswith(f"{target.table_uri}|")]:
                del _DV_CACHE[key]


def deleted_positions(target: DeltaTarget, f: LiveFile) -> np.ndarray:
    """The positions a live file's deletion vector covers (cached by the vector's unique id)."""
    if f.dv is None:
        return np.zeros(0, dtype=np.int64)
    key = f"{target.table_uri}|{f.path}|{f.dv.unique_id}"
    with _DV_LOCK:
        found = _DV_CACHE.get(key)
        if found is not None:
            _DV_CACHE.move_to_end(key)
            return found

    def read_range(where: str, start: int, end: int) -> bytes:
        location = where if f.dv is not None and f.dv.storage_type == "p" else target.url(where)
        return bytes(target.io.fs.cat_file(target.io.strip(location), start=start, end=end))

    positions = read_vector(f.dv, read_range)
    _remember_dv(key, positions)
    return positions


def remember_dv(target: DeltaTarget, path: str, unique_id: str, positions: np.ndarray) -> None:
    """Keep the positions of a vector this process wrote (no need to read it back)."""
    _remember_dv(f"{target.table_uri}|{path}|{unique_id}", positions)


def _remember_dv(key: str, positions: np.ndarray) -> None:
    with _DV_LOCK:
        _DV_CACHE[key] = positions
        total = sum(a.nbytes for a in _DV_CACHE.values())
        while total > DV_CACHE_BYTES and len(_DV_CACHE) > 1:
            _, old = _DV_CACHE.popitem(last=False)
            total -= old.nbytes


def live_references(target: DeltaTarget, epoch: int | None = None) -> set[str]:
    """Paths (relative, decoded) of live data files and of the DV files live files use; with ``epoch``
    also those the sink's commit of that epoch named (a later version -- its compaction -- may have
    removed them, but a reader of the epoch's version still reads them: VACUUM's job, not cleanup's)."""
    state = table_state(target)
    out = {name for f in state.files.values() for name in f.stored_files()}
    named = state.epoch_files.get(target.uid)
    if epoch is not None and named is not None and named[0] == epoch:
        out |= named[1]
    return out


