"""A routed Delta target: created on first use, its schema evolved by the source table's schema rows.

* **Created** when the first epoch with rows of its table commits (``createTable``, default
  true): version 0 written by the sink (put-if-absent), with deletion vectors (``mergeOnRead``)
  and the table property ``flinkish.primaryKey`` (the key the sink writes it by); its columns are
  the source table's and its mode's extra columns (``_deleted``, or ``_valid_from``/``_valid_to``/
  ``_current``: :mod:`~flinkish_spark.connectors.lakehouse.table_modes`), which the evolution keeps
  (they are the sink's, not the source's) and checks: a target written in another mode is one
  clear error before anything is written (:func:`~flinkish_spark.connectors.lakehouse.routed_modes.check_mode_columns`).
* **Evolved** in the epoch's own version: a ``metaData`` action with the new schema
  (columns added at the end, types widened), built from the table's current ``metaData``
  so that its id, configuration and partitioning stay. The rules are
  :mod:`flinkish_spark.connectors.lakehouse.evolution`'s, on Delta's types (both sides are
  brought through ``deltalake.Schema`` so that e.g. ``string`` and ``large_string`` are one).
* **Ahead of the changes**: a column a snapshot chunk widened (or brought) ahead of the change
  stream is listed in the table property ``flinkish.aheadOfChanges`` (JSON: column -> the type the
  changes announced last), written in the same ``metaData`` action; see
  :mod:`~flinkish_spark.connectors.lakehouse.evolution`. Absent when no column is ahead.
* **Widened types** are written into the schema without Delta's ``typeWidening`` table feature:
  delta-rs 1.x refuses to read tables that have it, and reads files written with the narrower
  type cast to the table's (so does Spark 4's Parquet reader). docs/lakehouse.md says so.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

import pyarrow as pa

from flinkish_spark.connectors.delta.live import LiveTarget, forget_state, table_state
from flinkish_spark.connectors.delta.log import VersionTaken, commit_payload
from flinkish_spark.connectors.delta.state import DeltaState, configuration
from flinkish_spark.connectors.delta.table import DV_PROPERTY, deltalake
from flinkish_spark.connectors.lakehouse.evolution import Evolution, ahead_property, evolve_epoch, read_ahead
from flinkish_spark.connectors.lakehouse.routed_modes import check_mode_columns
from flinkish_spark.connectors.lakehouse.routing import SchemaStep, routed_twice
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableMode
from flinkish_spark.errors import StorageUnavailableError, TableMismatchError

KEY_PROPERTY = "flinkish.primaryKey"
SOURCE_PROPERTY = "flinkish.sourceTable"  # the source table a routed target mirrors
AHEAD_PROPERTY = "flinkish.aheadOfChanges"  # columns a snapshot widened ahead of the change stream


def delta_arrow(schema: pa.Schema) -> pa.Schema:
    """``schema`` as Delta types read back (one Arrow type per Delta type)."""
    dl = deltalake()
    return pa.schema(dl.Schema.from_arrow(schema).to_arrow())


class RoutedDeltaTarget(LiveTarget):
    """One source table's Delta table; validated for the keyed writes, not against one fixed schema.

    A table deleted and created again at its path drops every cache of it (:meth:`LiveTarget.forget_table`,
    checked by :func:`~flinkish_spark.connectors.delta.live.table_state` on each call), as for one table."""

    def __init__(self, *args: Any, source_table: str, mode: TableMode = UPSERT, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.source_table = source_table
        self.mode = mode

    def validate(self, create: bool, component: str) -> Any:
        dl = deltalake()
        try:
            table = self.table()
        except OSError as exc:
            raise StorageUnavailableError(f"{component}: the Delta table {self.path!r} could not be read: {exc}") from None
        del dl
        self.check_table(table, component)
        return table

    def check_table(self, table: Any, component: str) -> None:
        self._check_keyed(table, f"{component} (source table {self.source_table})")

    def existing_state(self) -> DeltaState | None:
        """The table's state, None while it does not exist."""
        dl = deltalake()
        try:
            return table_state(self)
        except dl.exceptions.TableNotFoundError:
            return None

    def committed(self, epoch: int) -> bool:
        state = self.existing_state()  # a target not created (yet, or no longer) holds no epoch
        return state is not None and state.txn(self.uid) >= epoch

    def evolution(self, state: DeltaState | None, schemas: list[SchemaStep]) -> Evolution:
        """The target's schema after the epoch's source schemas (:meth:`TableEpoch.steps
        <flinkish_spark.connectors.lakehouse.routing.TableEpoch.steps>`); raises SchemaChangeError."""
        current = pa.schema([])
        key: tuple[str, ...] | None = None
        ahead = {}
        if state is not None and state.metadata is not None:
            current = delta_arrow(deltalake().Schema.from_json(state.metadata["schemaString"]).to_arrow())
            ahead = read_ahead(configuration(state.metadata).get(AHEAD_PROPERTY))
            recorded = configuration(state.metadata).get(KEY_PROPERTY)
            key = tuple(recorded.split(",")) if recorded else None
            mirrored = configuration(state.metadata).get(SOURCE_PROPERTY)
            if mirrored and mirrored != self.source_table:
                raise routed_twice(sorted((mirrored, self.source_table)), self.path, "path")
        name = f"the Delta table {self.path}"
        fix = ("Rewrite the target with the column cast to the new type (e.g. read it with delta-rs, cast, and "
               "write_deltalake(..., mode='overwrite', schema_mode='overwrite')) and restart, or mirror the table to a "
               "new path with a new sink uid.")
        key_fix = (f"Mirror the table to a new path with a new sink uid; or, if its rows are unique by the new key, "
                   f"set the table property: DeltaTable({self.table_uri!r}).alter.set_table_properties("
                   f"{{'{KEY_PROPERTY}': '<new key, comma-separated>'}}) and restart.")
        if state is not None and state.metadata is not None:
            have = tuple(state.metadata.get("partitionColumns") or ())
            if have != self.partition_by:  # never changed by the sink: its files would mix two layouts
                raise TableMismatchError(
                    f"flinkish.delta sink uid {self.uid!r}: {name} is "
                    f"{'partitioned by ' + ', '.join(have) if have else 'unpartitioned'}, but the sink's tableModes "
                    f"give source table {self.source_table} "
                    f"{'partitionBy ' + ', '.join(self.partition_by) if self.partition_by else 'no partitionBy'}; "
                    f"nothing was written. Give the table's rule its partitioning (partitionBy: {list(have)}), or "
                    "mirror the table to a new target (a new sink uid, or drop the target and restart with a new "
                    "uid); the sink never changes a target's partitioning.")
        if state is not None:
            check_mode_columns(self.source_table, name, current.names,
                               {c.name for s in schemas for c in s.schema.columns}, self.mode,
                               "the sink's options 'mode', 'deletes', 'tableModes'")
        evolution = evolve_epoch(self.source_table, name, current, key,
                                 [(delta_arrow(s.schema.arrow_schema()), s.schema.key, s.announced, s.passing)
                                  for s in schemas],
                                 fix, key_fix,
                                 ahead)
        self.mode.check_partitions(evolution.schema.names, self.source_table)  # before anything is written
        if state is None and self.mode.extra_columns:  # created with the mode's columns, after the source's
            assert self.plan is not None
            extra = [self.plan.table_schema.field(c) for c in self.mode.extra_columns]
            evolution = dataclasses.replace(evolution, schema=delta_arrow(pa.schema(list(evolution.schema) + extra)))
        return evolution

    def ensure_created(self, evolution: Evolution, create: bool, exists: bool = False) -> bool:
        """Create the table with the evolved schema if it does not exist; whether it was created now. ``exists``:
        the caller read the table's state in this commit already (no second read of its log)."""
        if exists or self.existing_state() is not None:
            return False
        if not create:
            raise TableMismatchError(
                f"flinkish.delta sink uid {self.uid!r}: there is no Delta table at {self.path!r} for source table "
                f"{self.source_table} and createTable is false; create it, or set createTable to true"
            )
        assert self.plan is not None
        try:
            self.log().write_version(0, create_payload(evolution.schema, self.plan.key, self.plan.merge_mode == "mergeOnRead",
                                                       self.source_table, ahead_property(evolution), self.partition_by))
        except VersionTaken:
            pass  # created at the same moment by another writer (or our earlier attempt): validated when loaded
        forget_state(self)
        return True


def create_payload(schema: pa.Schema, key: tuple[str, ...], deletion_vectors: bool, source_table: str,
                   ahead: str | None = None, partition_by: tuple[str, ...] = ()) -> bytes:
    """Version 0 of a routed target: protocol (deletion vectors, timestamps without zone) and metaData with the
    key, the source table (two source tables routed to one target are refused) and the columns ahead of the
    changes (``ahead``: :data:`AHEAD_PROPERTY`'s value, None for none).

    Written by the sink (put-if-absent) rather than delta-rs's ``create``, which refuses table
    properties it does not know (``flinkish.primaryKey``).
    """
    dl = deltalake()
    features = (["deletionVectors"] if deletion_vectors else []) + (
        ["timestampNtz"] if any(_has_ntz(f.type) for f in schema) else [])
    configuration = {KEY_PROPERTY: ",".join(key), SOURCE_PROPERTY: source_table, **({DV_PROPERTY: "true"} if deletion_vectors else {}),
                     **({AHEAD_PROPERTY: ahead} if ahead else {})}
    now = int(time.time() * 1000)
    actions = [
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": features, "writerFeatures": features}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      # partition columns are also kept in the data files (the keyed commit reads rows back
                      # from them; readers take a partition's value from the log, as with Delta's
                      # materializePartitionColumns)
                      "schemaString": dl.Schema.from_arrow(schema).to_json(), "partitionColumns": list(partition_by),
                      "configuration": configuration, "createdTime": now}},
    ]
    return commit_payload("", None, actions, {}, None, blind=False, operation="CREATE TABLE")


def _has_ntz(t: pa.DataType) -> bool:
    if pa.types.is_timestamp(t):
        return t.tz is None
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_ntz(t.value_type)
    return False


def schema_actions(target: RoutedDeltaTarget, state: DeltaState, evolution: Evolution) -> list[dict[str, Any]]:
    """The ``metaData`` action that gives the table the evolved schema and ahead map; none when it has them already."""
    if state.metadata is None or not evolution.changes:
        return []
    dl = deltalake()
    current = json.loads(state.metadata["schemaString"])
    have = delta_arrow(dl.Schema.from_json(state.metadata["schemaString"]).to_arrow())
    properties = {k: v for k, v in configuration(state.metadata).items() if k != AHEAD_PROPERTY}
    ahead = ahead_property(evolution)
    if ahead:
        properties[AHEAD_PROPERTY] = ahead
    if have == evolution.schema and properties == configuration(state.metadata):
        return []

    def field_json(f: pa.Field) -> dict[str, Any]:
        return dict(json.loads(dl.Schema.from_arrow(pa.schema([f])).to_json())["fields"][0])

    fields = []
    by_name = {f.name: f for f in evolution.schema}
    for f in current["fields"]:
        new = by_name.get(f["name"])
        if new is not None and have.field(f["name"]).type != new.type:
            f = {**f, "type": field_json(new)["type"]}
        fields.append(f)
    names = {f["name"] for f in current["fields"]}
    fields += [field_json(f) for f in evolution.schema if f.name not in names]
    meta = dict(state.metadata)
    meta["configuration"] = properties
    fmt = dict(meta.get("format") or {"provider": "parquet"})
    fmt["options"] = dict(fmt.get("options") or {})  # a checkpoint's map reads back as pairs
    meta["format"] = fmt
    meta["schemaString"] = json.dumps({"type": "struct", "fields": fields}, separators=(",", ":"))
    return [{"metaData": meta}]
