"""Merged shards in the routed lakehouse sinks (Delta, Iceberg): what both formats do alike (:mod:`.routes`).

* **Prepare**: a shard's rows get the column ``_source_table`` (``schema.table``) and its schema the shard schema
  (:func:`~flinkish_spark.connectors.lakehouse.routes.shard_schema`) -- :func:`shard_tables`; from there the keyed
  prepare writes the shard's files below its target as for any table.
* **Commit**: the epoch's parts of every shard of one target are **one** :class:`MergedEpoch` -- one commit per
  target per epoch holding every shard's rows, under the target's one idempotence record (Delta's txn, Iceberg's
  snapshot marker): a restart finds the target with the epoch or commits all its shards. Keyed by ``_source_table``,
  two shards' rows never share a key, so their keyed parts apply together in any order. Its truncate and
  re-snapshot flags are none: each shard's (:attr:`MergedEpoch.shards`) take only that shard's rows, which each
  format finds by ``_source_table`` in its live files.
* **Schema**: the shards' schemas are the target's evolution steps, one shard after the other, each as a snapshot
  schema: a shard's column narrower than the target's (another shard widened it) fits and is written as is; a
  column one shard added is the target's, null in the other shards' rows; another kind of type is the routed
  sink's stop naming the fix. Shards of different key columns, or of different modes, stop before anything is
  written (:func:`merged_tables`).
* **History**: a truncated shard's current versions close at its truncate's time (:func:`shard_close_times`: the
  rows it took by their ``_source_table``, its keys the epoch writes again by their key's shard); a re-snapshot's
  end closes its shard's undelivered keys at the epoch's newest change of the target, as a single table's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.changes import OP
from flinkish_spark.connectors.lakehouse.resnapshot import positions_not_in
from flinkish_spark.connectors.lakehouse.routed_modes import close_time_us
from flinkish_spark.connectors.lakehouse.routes import SOURCE_TABLE, Routes, check_shard_keys, shard_schema
from flinkish_spark.connectors.lakehouse.routing import P, Route, SchemaStep, TableEpoch, TableInput
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.errors import ConfigError


def label(route: Route, table: str) -> str:
    """What a target records as its source: the table, or for a merged target its rule's patterns (the same for
    every shard, so a shard's commit is never taken for another table's target)."""
    rule = route.merged(table)
    return table if rule is None else f"{rule.source_table} (merged)"


def _tag(rows: pa.Table | None, table: str) -> pa.Table | None:
    if rows is None:
        return None
    at = rows.schema.get_field_index(OP)  # after the data columns, before _op, _lsn, ...
    return rows.add_column(at, SOURCE_TABLE, pa.array([table] * rows.num_rows, pa.string()))


def shard_tables(tables: Iterable[tuple[str, TableSchema, TableInput]], route: Route
                 ) -> Iterator[tuple[str, TableSchema, TableInput]]:
    """A task's tables with each merged shard's rows tagged with ``_source_table`` and its schema the shard schema."""
    for name, schema, data in tables:
        rule = route.merged(name)
        if rule is None:
            yield name, schema, data
            continue
        earlier = tuple(shard_schema(TableSchema.from_json(e), rule).to_json() for e in data.earlier)
        changes = _tag(data.changes, name)
        assert changes is not None
        yield name, shard_schema(schema, rule), replace(data, changes=changes, whole=_tag(data.whole, name),
                                                        earlier=earlier)


@dataclass
class MergedEpoch(TableEpoch[P], Generic[P]):
    """Every shard's parts of one merged target in one epoch; ``table`` is the first shard (it names the target and
    the mode, the same for all). Its own truncate / re-snapshot flags are none: each shard's are its own."""

    shards: dict[str, TableEpoch[P]] = field(default_factory=dict)

    def steps(self) -> list[SchemaStep]:
        return [s._replace(announced=False) for t in self.shards.values() for s in t.steps()]

    @property
    def begin(self) -> bool:
        return False

    @property
    def end(self) -> bool:
        return False

    @property
    def truncate(self) -> bool:
        return False

    def counted(self) -> list[P]:
        return [p for t in self.shards.values() for p in t.counted()]


def merged_tables(tables: list[TableEpoch[P]], route: Route, mode_of: Callable[[str], Any],
                  sink: str) -> list[TableEpoch[P]]:
    """The epoch's tables with the shards of each merged target as one :class:`MergedEpoch` (after the others'
    order: by its first shard's name); shards of different keys or modes refused before anything is written."""
    if not isinstance(route, Routes) or not route.merging:
        return tables
    out: list[TableEpoch[P]] = []
    groups: dict[str, list[TableEpoch[P]]] = {}
    for t in tables:
        if route.merged(t.table) is None:
            out.append(t)
        else:
            groups.setdefault(route.target(t.table), []).append(t)
    for target, shards in groups.items():
        check_shard_keys(target, [(t.table, t.schemas()[-1].key) for t in shards if t.schemas()])
        check_shard_modes(target, {t.table: mode_of(t.table) for t in shards}, sink)
        first = min(t.table for t in shards)
        out.append(MergedEpoch(first, [p for t in shards for p in t.parts], {t.table: t for t in shards}))
    return sorted(out, key=lambda t: t.table)


def check_shard_modes(target: str, modes: dict[str, Any], sink: str) -> None:
    """Refuse shards of one target of different modes (``modes``: table -> its TableMode); every mode merges (history:
    a shard's truncate or re-snapshot end closes only its versions, :func:`shard_close_times`)."""
    if len(set(modes.values())) > 1:
        shown = ", ".join(f"{n} ({m.describe()})" for n, m in sorted(modes.items()))
        raise ConfigError(f"the shards merged into {target} are {shown}: a merged {sink} target takes one mode for "
                          "all its shards. Give the shards one mode (the sink's 'tableModes'), or route them to "
                          "targets of their own")


def shard_close_times(t: MergedEpoch[Any]) -> tuple[tuple[str, int], ...]:
    """History: each truncated shard's close time (its truncate's commit time, as a single table's truncate): its
    current versions -- and only its -- close then, whatever the other shards do in the epoch."""
    return tuple((shard, close_time_us(st.parts, True)) for shard, st in sorted(t.shards.items()) if st.truncate)


def shard_read_columns(key: list[str], seen: pa.Table | None) -> list[str]:
    """The columns of a target's data file that :func:`shard_file_positions` needs."""
    return [SOURCE_TABLE] + (key if seen is not None else [])


def shard_file_positions(rows: pa.Table, shard: str, key: list[str], seen: pa.Table | None,
                         deleted: np.ndarray) -> np.ndarray:
    """The live rows of ``shard`` in one data file of its merged target (``rows``: the file's
    :func:`shard_read_columns`; ``deleted``: the file's deleted positions); with ``seen`` (a re-snapshot's keys),
    only those whose key is not in it -- a ``seen`` without columns (the re-snapshot delivered no row) takes them all."""
    mine = np.flatnonzero(np.asarray(pc.fill_null(pc.equal(rows.column(SOURCE_TABLE), shard), False)))
    if seen is not None and seen.num_columns and len(mine):
        mine = np.intersect1d(mine, positions_not_in(rows.select(key), seen.select(key)))
    return np.setdiff1d(mine, deleted)


def add_positions(into: dict[str, np.ndarray], more: dict[str, np.ndarray]) -> None:
    """``more`` (file -> sorted positions) added to ``into``."""
    for path, positions in more.items():
        into[path] = positions if path not in into else np.union1d(into[path], positions)
