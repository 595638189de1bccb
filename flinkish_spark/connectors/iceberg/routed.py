"""``flinkish.iceberg`` with ``{schema}``/``{table}`` in ``table``: the multi-table stream, one keyed Iceberg table per source table.

* **Prepare** (executors): a task splits its rows per table
  (:func:`~flinkish_spark.connectors.postgres.rows.split_tables`) and for each table writes what
  the keyed prepare writes for one table (:func:`~flinkish_spark.connectors.iceberg.keyed.prepare`:
  data files below the target's ``data/flinkish/<uid>/e<epoch>/`` and the task's entries), with
  the field ids the columns will have once the epoch commits
  (:func:`~.routed_target.write_schema`: the task loads the target from the catalog, read only;
  a target that does not exist yet gets its files below the location the commit creates it at).
  The part also carries the task's newest schema of the table, a truncate and re-snapshot
  markers (:class:`RoutedPart`). Nothing is visible to a reader.
* **Commit** (driver, after the decision names every table's part): first, for every table
  the epoch changed that does not hold the epoch yet, the target's evolution is computed
  (:mod:`flinkish_spark.connectors.lakehouse.evolution`, on Iceberg's types and promotions) --
  a change it cannot follow raises :class:`~flinkish_spark.errors.SchemaChangeError` before any
  table is written. Then table by table (sorted by name): the target is created, or its schema
  updated (one metadata commit: columns added, types promoted), then one snapshot applies the
  epoch's changes (:func:`~flinkish_spark.connectors.iceberg.keyed.plan_epoch`: a truncate
  removes every live file first; a re-snapshot's end deletes the rows it did not deliver) with
  the summary properties ``flinkish.uid`` / ``flinkish.epoch``.
* **Exactly once across tables**: each table's snapshot marker makes its commit idempotent on
  its own. A restart commits the decided epoch again: tables whose newest epoch of the uid is
  >= the epoch are skipped (a table's marker moves only when the table changes, and epochs
  commit in order), the others are committed. A schema update without its data snapshot (a
  crash between the two, crash point ``iceberg.routed.after_schema``) is no change the next
  time. Crash point ``sink.between_tables``: after the first table's snapshot, before the next.
* **Reset checkpoints**: :meth:`RoutedIcebergSink.last_committed_epoch` is the newest epoch of
  the uid in any catalog table the route can name (:mod:`flinkish_spark.sink.incarnation`).
  Targets are loaded from the catalog on every commit: no cache to outlive a dropped table.
* **Cost**: only the tables in the epoch's rows are touched; a table that did not change gets
  no read, no commit and no snapshot.
* **Modes** (``mode`` / ``deletes`` / ``tableModes``, per table:
  :mod:`~flinkish_spark.connectors.lakehouse.table_modes`): a task writes its files with the mode's
  columns too (``_deleted``, or the history columns: field ids after the source's at creation); the
  evolution checks an existing target's mode columns
  (:func:`~flinkish_spark.connectors.lakehouse.routed_modes.check_mode_columns`); a truncate or a
  re-snapshot's end marks, closes or keeps the rows it takes by the table's mode
  (:class:`~flinkish_spark.connectors.lakehouse.routed_modes.GoneMarks`, in the epoch's one snapshot).
* **Partitions** (a ``tableModes`` rule's ``partitionBy``): the target is created with identity partitions
  on those columns and written per partition (tasks, copies, rewrites, compaction); an existing target whose
  partitioning differs is refused before anything is written, never changed.
* **Compaction** (``compactEvery`` = N, mergeOnRead; default 0: off): right after the epoch's
  snapshot that brings a table's sequence number s to (s + offset) % N == 0 -- about every N of its
  own snapshots, at an offset of its own (crc32 of the identifier mod N), so tables changing together
  do not all compact in the same epoch -- the one-table sink's compaction (:mod:`.compact`: data
  files with position deletes, and small files (two or more under a quarter of ``rowsPerFile``), written
  again, one ``replace`` snapshot that asserts ``main`` did not
  move, carrying the epoch's marker). A crash before its snapshot (crash point
  ``iceberg.compaction.before_snapshot``) leaves files in the epoch's folder that the epoch's
  cleanup deletes; the restart skips the table (it holds the epoch).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import pyarrow as pa

from flinkish_spark.connectors.iceberg.catalog import load, pyiceberg
from flinkish_spark.connectors.iceberg.commit import commit_snapshot
from flinkish_spark.connectors.iceberg.compact import compact
from flinkish_spark.connectors.iceberg.datafiles import epoch_folder, write_data_files
from flinkish_spark.connectors.iceberg.keyed import DRIVER_PARTITION, KeyedCommittable, Target, entries_of, plan_epoch, prepare
from flinkish_spark.connectors.iceberg.resnapshot import gone_rows
from flinkish_spark.connectors.iceberg.routed_target import (
    AHEAD_PROPERTY,
    KEY_PROPERTY,
    SOURCE_PROPERTY,
    check_promotions,
    identity_spec,
    partitioning,
    evolve_table,
    fitted_schema,
    iceberg_arrow,
    misfits,
    read_file,
    table_arrow,
    write_schema,
)
from flinkish_spark.connectors.iceberg.table import (
    CREATED_TABLE_PROPERTIES,
    EPOCH_PROPERTY,
    UID_PROPERTY,
    TableInfo,
    committed_epoch,
    files_added_by,
    info_of,
    keyed_properties,
)
from flinkish_spark.connectors.lakehouse.changes import COMMIT_TS, LSN, OP, UNCHANGED, MergeMode
from flinkish_spark.connectors.lakehouse.evolution import Evolution, ahead_property, evolve_epoch, read_ahead
from flinkish_spark.connectors.lakehouse.files import DEFAULT_ROWS_PER_FILE, DEFAULT_TARGET_FILE_SIZE
from flinkish_spark.connectors.lakehouse.figures import epoch_figures
from flinkish_spark.connectors.lakehouse.resnapshot import ResnapshotKeys
from flinkish_spark.connectors.lakehouse.routed_modes import GoneMarks, check_mode_columns, close_time_us, gone_rows_as
from flinkish_spark.connectors.iceberg.routed_shards import finish_resnapshots, shard_gone
from flinkish_spark.connectors.lakehouse.routes import Routes
from flinkish_spark.connectors.lakehouse.shards import MergedEpoch, label, merged_tables, shard_close_times, shard_tables
from flinkish_spark.connectors.lakehouse.routing import (
    Route,
    TableEpoch,
    TablePart,
    routed_twice,
    source_columns,
    table_plan,
    tables_of,
    task_tables,
    truncates_as_deletes,
)
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableModes
from flinkish_spark.connectors.lakehouse.transform.hooks import transformed
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms
from flinkish_spark.errors import ConfigError, TableMismatchError
from flinkish_spark.faults import crash_point
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

COMPONENT = "flinkish.iceberg sink"
_WHOLE_FILE = 1 << 62  # rows / bytes: a rewritten file stays one file (its row positions are kept)


@dataclass(frozen=True)
class RoutedPart(TablePart):
    """One table's share of one task: :class:`~flinkish_spark.connectors.lakehouse.routing.TablePart` and the keyed files."""

    keyed: KeyedCommittable | None
    location: str = ""  # the target location the files are below
    files_schema: str = ""  # the Iceberg schema (field ids) the files were written with


@dataclass(frozen=True)
class RoutedCommittable:
    partition: int
    parts: tuple[RoutedPart, ...]


class RoutedIcebergSink(TwoPhaseCommitSink[RoutedCommittable]):
    #: Columns and rows chosen per table (option ``transforms``), applied to each task's rows before anything else.
    transforms: Transforms = Transforms()

    def __init__(self, catalog_properties: dict[str, str], route: Route, uid: str, options: Mapping[str, str] | None = None,
                 merge_mode: MergeMode = "mergeOnRead", rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 target_file_size: int = DEFAULT_TARGET_FILE_SIZE, retain_snapshots: int = 100,
                 create_table: bool = True, metadata_io: FileIO | None = None, metadata_dir: str | None = None,
                 compact_every: int = 0, modes: TableModes = TableModes()) -> None:
        self.catalog_properties, self.route, self.uid = catalog_properties, route, uid
        self.modes = modes
        self.compact_every = compact_every
        self.options = dict(options or {})
        self.merge_mode, self.rows_per_file, self.target_file_size = merge_mode, rows_per_file, target_file_size
        self.retain_snapshots, self.create_table = retain_snapshots, create_table
        self.resnapshots = ResnapshotKeys(metadata_io, metadata_dir) if metadata_io is not None and metadata_dir else None

    # -- the targets ---------------------------------------------------------------------------

    def catalog(self) -> Any:
        return load(self.catalog_properties)

    def io_for(self, location: str) -> FileIO:
        return FileIO.for_url(location, storage_options_from(self.options, location), what="table location")

    def load_target(self, identifier: str) -> Any | None:
        pyiceberg()
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog().load_table(identifier)
        except NoSuchTableError:
            return None

    def default_location(self, identifier: str) -> str:
        """Where a target the sink creates lives: ``<warehouse>/<namespace>/<name>`` (pyiceberg's convention)."""
        warehouse = self.catalog_properties.get("warehouse") or self.catalog().properties.get("warehouse")
        if not warehouse:
            raise ConfigError(f"{COMPONENT} uid {self.uid!r}: routing creates its targets below the catalog's warehouse, "
                              "but neither the option 'warehouse' nor the catalog sets one; set 'warehouse'")
        namespace, name = identifier.rsplit(".", 1)
        return f"{warehouse.rstrip('/')}/{namespace}/{name}"

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> RoutedCommittable | None:
        parts = []
        for name, schema, data in shard_tables(transformed(self.transforms, task_tables(batches)),
                                               self.route):  # merged shards: + _source_table
            part = RoutedPart(name, schema.to_json(), data.lsn, data.truncate, data.begin, data.end, None,
                              earlier=data.earlier, figures=data.figures, truncate_us=data.truncate_us)
            # A mode that keeps what a truncate takes applies the changes before it too, the truncate a delete of them.
            changes = (truncates_as_deletes(data, schema.key) if data.truncate and self.modes.of(name).shape != UPSERT.shape
                       else data.changes)
            if changes.num_rows:
                part = self._prepare_table(part, schema.key, changes, ctx)
            parts.append(part)
        return RoutedCommittable(ctx.partition_id, tuple(parts)) if parts else None

    def _prepare_table(self, part: RoutedPart, key: tuple[str, ...], changes: pa.Table, ctx: PrepareContext) -> RoutedPart:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        identifier = self.route.target(part.table)
        table = self.load_target(identifier)
        mode = self.modes.of(part.table)
        columns = pa.schema([f for f in changes.schema if f.name not in (OP, LSN, COMMIT_TS, UNCHANGED)])
        mode.check_partitions(columns.names, part.table)
        extra = [f for f in table_plan(columns, key, self.merge_mode, mode, part.table).table_schema
                 if f.name in mode.extra_columns]
        schema = write_schema(table, pa.schema(list(columns) + extra))  # the files hold the mode's columns too
        types = schema_to_pyarrow(schema, include_field_ids=False)
        plan = table_plan(pa.schema([f for f in types if f.name not in mode.extra_columns]), key, self.merge_mode,
                          mode, part.table)
        changes = changes.cast(plan.input_schema)
        if table is None:
            info = TableInfo(self.default_location(identifier), schema.model_dump_json(),
                             identity_spec(schema, mode.partition_by).model_dump_json(),
                             tuple(sorted(self._created_properties(key, label(self.route, part.table)).items())))
        else:
            info = dataclasses.replace(info_of(table), schema_json=schema.model_dump_json())
        target = Target(self.io_for(info.location), info, self.uid, plan, mode.partition_by, self.rows_per_file,
                        self.target_file_size)
        keyed = prepare(target, iter(changes.to_batches()), ctx, f"{COMPONENT} uid {self.uid!r} (source table {part.table})")
        return dataclasses.replace(part, keyed=keyed, location=info.location, files_schema=schema.model_dump_json())

    def _created_properties(self, key: tuple[str, ...], source_table: str) -> dict[str, str]:
        return {**CREATED_TABLE_PROPERTIES, **keyed_properties(self.merge_mode), KEY_PROPERTY: ",".join(key),
                SOURCE_PROPERTY: source_table}

    # -- commit (driver) -------------------------------------------------------------------------

    def _tables(self, committables: list[RoutedCommittable]) -> list[TableEpoch[RoutedPart]]:
        tables = tables_of((p for c in committables for p in c.parts), self.route, "table")
        return merged_tables(tables, self.route, self.modes.of, "Iceberg")  # one snapshot per merged target

    def commit(self, committables: list[RoutedCommittable], epoch: int) -> CommitOutcome:
        pyiceberg()
        pending = []
        for t in self._tables(committables):
            identifier = self.route.target(t.table)
            table = self.load_target(identifier)
            if table is not None and committed_epoch(table, self.uid) >= epoch:
                continue  # this table has the epoch (a recovered commit)
            # Every table's evolution is checked before the first table is written: a change
            # that cannot be followed ends the query with nothing of the epoch visible.
            pending.append((t, identifier, table, self.evolution(t, identifier, table)))
        for i, (t, identifier, table, evolution) in enumerate(pending):
            if i:
                crash_point("sink.between_tables")  # earlier tables have the epoch, this one not yet
            changed = table is None or evolution.changes
            table = self.ensure(t, identifier, table, evolution)
            if changed:
                crash_point("iceberg.routed.after_schema")  # created or updated, the epoch's snapshot not yet
            outcome = self.commit_table(t, identifier, table, epoch)
            if outcome not in ("COMMITTED", "ALREADY_COMMITTED"):
                return outcome
        return "COMMITTED"

    def evolution(self, t: TableEpoch[RoutedPart], identifier: str, table: Any | None) -> Evolution:
        """The target's schema after the epoch's source schemas; raises SchemaChangeError."""
        current, key, ahead = pa.schema([]), None, {}
        if table is not None:
            current = table_arrow(table.schema())
            ahead = read_ahead(table.properties.get(AHEAD_PROPERTY))
            recorded = table.properties.get(KEY_PROPERTY)
            key = tuple(recorded.split(",")) if recorded else None
            mirrored = table.properties.get(SOURCE_PROPERTY)
            if mirrored and mirrored != label(self.route, t.table):
                raise routed_twice(sorted((mirrored, label(self.route, t.table))), identifier, "table")
        name = f"the Iceberg table {identifier}"
        fix = ("Rewrite the target with the column cast to the new type (e.g. create the table anew with pyiceberg "
               "with that type and append its rows cast) and restart, or mirror the table to a new target with a new "
               "sink uid.")
        key_fix = (f"Mirror the table to a new target with a new sink uid; or, if its rows are unique by the new key, "
                   f"set the table property {KEY_PROPERTY!r} to the new key (comma-separated; pyiceberg: "
                   f"`with table.transaction() as tx: tx.set_properties({{'{KEY_PROPERTY}': '...'}})`) and restart.")
        mode = self.modes.of(t.table)
        steps = t.steps()
        if table is not None:
            check_mode_columns(t.table, name, current.names, {c.name for s in steps for c in s.schema.columns}, mode,
                               "the sink's options 'mode', 'deletes', 'tableModes'")
        evolution = evolve_epoch(t.table, name, current, key,
                                 [(iceberg_arrow(s.schema.arrow_schema()), s.schema.key, s.announced, s.passing)
                                  for s in steps],
                                 fix, key_fix, ahead)
        check_promotions(t.table, name, evolution)
        mode.check_partitions(evolution.schema.names, t.table)  # before anything of the epoch is written
        if table is None and mode.extra_columns:  # created with the mode's columns, after the source's
            plan = table_plan(pa.schema([]), key or (), self.merge_mode, mode, t.table)
            evolution = dataclasses.replace(evolution, schema=iceberg_arrow(pa.schema(list(evolution.schema) + [
                plan.table_schema.field(c) for c in mode.extra_columns])))
        return evolution

    def ensure(self, t: TableEpoch[RoutedPart], identifier: str, table: Any | None, evolution: Evolution) -> Any:
        """The target, created with the evolved schema or its schema updated to it."""
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
        from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids
        from pyiceberg.schema import assign_fresh_schema_ids

        mode = self.modes.of(t.table)
        if table is not None:
            self._check_target(identifier, table, t.table)
            return evolve_table(table, evolution)
        if not self.create_table:
            raise TableMismatchError(
                f"{COMPONENT} uid {self.uid!r}: there is no Iceberg table {identifier!r} for source table {t.table} "
                "and createTable is false; create it, or set createTable to true")
        catalog = self.catalog()
        try:
            catalog.create_namespace(identifier.rsplit(".", 1)[0])
        except NamespaceAlreadyExistsError:
            pass
        key = t.schemas()[-1].key
        ahead = ahead_property(evolution)
        schema = assign_fresh_schema_ids(_pyarrow_to_schema_without_ids(evolution.schema))
        try:
            return catalog.create_table(identifier, schema=schema, partition_spec=identity_spec(schema, mode.partition_by),
                                        location=self.default_location(identifier),
                                        properties={**self._created_properties(key, label(self.route, t.table)),
                                                    **({AHEAD_PROPERTY: ahead} if ahead else {})})
        except TableAlreadyExistsError:  # our earlier attempt, or another writer: checked as an existing target
            table = catalog.load_table(identifier)
            self._check_target(identifier, table, t.table)
            return evolve_table(table, self.evolution(t, identifier, table))

    def _check_target(self, identifier: str, table: Any, source_table: str) -> None:
        have, want = partitioning(table), self.modes.of(source_table).partition_by
        if have != want:  # never changed by the sink: a target's files would mix two layouts
            raise TableMismatchError(
                f"{COMPONENT} uid {self.uid!r}: the Iceberg table {identifier!r} is "
                f"{'partitioned by ' + ', '.join(have) if have else 'unpartitioned'}, but the sink's tableModes give "
                f"source table {source_table} {'partitionBy ' + ', '.join(want) if want else 'no partitionBy'}; nothing "
                "was written. Give the table's rule its partitioning (partitionBy: "
                f"{list(have)}), or mirror the table to a new target (a new sink uid, or drop the target and restart "
                "with a new uid); the sink never changes a target's partitioning.")
        if self.merge_mode == "mergeOnRead" and table.metadata.format_version < 2:
            raise TableMismatchError(
                f"{COMPONENT} uid {self.uid!r}: the Iceberg table {identifier!r} has format version "
                f"{table.metadata.format_version}; mergeMode 'mergeOnRead' writes position delete files, which need "
                "version 2. Upgrade it (pyiceberg: tx.upgrade_table_version(format_version=2)), or set mergeMode to "
                "copyOnWrite.")

    def commit_table(self, t: TableEpoch[RoutedPart], identifier: str, table: Any, epoch: int) -> CommitOutcome:
        from pyiceberg.exceptions import CommitFailedException

        table = self.catalog().load_table(identifier)
        key = t.schemas()[-1].key
        counted = [p for p in t.counted() if p.keyed is not None]
        keyed = [self._fitted(p, table, epoch, self.modes.of(t.table).partition_by) for p in counted]
        marker = {UID_PROPERTY: self.uid, EPOCH_PROPERTY: str(epoch)}
        io = self.io_for(table.location())
        mode = self.modes.of(t.table)
        how = gone_rows_as(mode)
        close_us = close_time_us(t.parts, t.truncate)  # when history closes what the epoch takes
        for attempt in range(10):
            if committed_epoch(table, self.uid) >= epoch:
                return "ALREADY_COMMITTED"
            plan = table_plan(source_columns(table_arrow(table.schema()), mode), key, self.merge_mode, mode, t.table)
            target = Target(io, info_of(table), self.uid, plan, mode.partition_by, self.rows_per_file,
                            self.target_file_size)
            written: list[str] = []
            try:
                gone = None
                if how != "keep" and self.resnapshots is not None and (t.begin or t.end or self.resnapshots.active(identifier)):
                    entries = [entries_of(k, io, epoch) for k in keyed]
                    seen = self.resnapshots.step(identifier, key, entries, t.begin, t.end, epoch)
                    gone = None if seen is None or t.truncate else gone_rows(target, table, seen)
                if isinstance(t, MergedEpoch):  # each shard's truncate / re-snapshot takes only its rows
                    gone = shard_gone(t, target, table, [(p.table, k) for p, k in zip(counted, keyed)], io, epoch,
                                      self.resnapshots, identifier, how)
                if t.truncate and how in ("soft", "close"):
                    marks = GoneMarks(how, rest_gone=True, close_us=close_us,
                                      close_by_us=close_us if how == "close" else -1, routed=True)
                else:  # a merged target's truncated shards (history): each closes its own versions at its time
                    marks = GoneMarks(how, close_us=close_us, routed=True,
                                      shard_close_us=shard_close_times(t) if isinstance(t, MergedEpoch) and how == "close" else ())
                planned = plan_epoch(target, table, keyed, epoch, truncate=t.truncate and how == "delete", gone=gone,
                                     marks=marks)
                written = planned.written
                table = commit_snapshot(self.catalog(), table, planned.changes, target.spec_id, marker,
                                        retain=self.retain_snapshots, protect_property=UID_PROPERTY,
                                        delete_files=self._delete_quietly(io))
                if t.end and self.resnapshots is not None:
                    self.resnapshots.finish(identifier)
                if isinstance(t, MergedEpoch):
                    finish_resnapshots(t, identifier, self.resnapshots)
                self._compact_if_due(target, identifier, table, epoch, marker, io)
                return "COMMITTED"
            except CommitFailedException:
                # Another writer came first: re-read the table, check again, look the keys up again.
                io.delete_many(written)
                time.sleep(min(0.05 * 2 ** attempt, 2.0))
                table = self.catalog().load_table(identifier)
        return "RETRY_LATER"

    def _compact_if_due(self, target: Target, identifier: str, table: Any, epoch: int, marker: dict[str, str],
                        io: FileIO) -> None:
        """The table's compaction when its sequence number is due (module docstring); the epoch is committed
        already: a failure is logged, the table's next due snapshot tries again."""
        every = self.compact_every
        if not every or self.merge_mode != "mergeOnRead":
            return
        if (table.metadata.last_sequence_number + zlib.crc32(identifier.encode()) % every) % every:
            return
        try:
            compact(target, self.catalog(), table, lambda: self.catalog().load_table(identifier), epoch, marker,
                    self.retain_snapshots, UID_PROPERTY, self._delete_quietly(io))
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("flinkish.iceberg: compaction of %s after epoch %d failed: %s", identifier, epoch, exc)

    def _fitted(self, part: RoutedPart, table: Any, epoch: int, partition_by: tuple[str, ...]) -> KeyedCommittable:
        """The part's files, rewritten when their field ids or types are not the target's (see :mod:`.routed_target`)."""
        from pyiceberg.schema import Schema

        assert part.keyed is not None
        files_schema = Schema.model_validate_json(part.files_schema)
        if not misfits(files_schema, table.schema()):
            return part.keyed
        fitted = fitted_schema(files_schema, table.schema())
        info = dataclasses.replace(info_of(table), location=part.location, schema_json=fitted.model_dump_json())
        io = self.io_for(part.location)
        files = []
        for f in part.keyed.files:
            rows = read_file(io, f.path)
            new = write_data_files(io, info, self.uid, iter(rows.to_batches()),
                                   PrepareContext(self.uid, epoch, DRIVER_PARTITION, 1), partition_by, _WHOLE_FILE,
                                   _WHOLE_FILE)
            assert len(new) == 1, "a rewritten file is one file"
            files.append(new[0])
        log.info("flinkish.iceberg: %d file(s) of %s rewritten with the target's field ids", len(files), part.table)
        return dataclasses.replace(part.keyed, files=tuple(files))

    @staticmethod
    def _delete_quietly(io: FileIO) -> Any:
        def delete(paths: list[str]) -> None:
            try:
                io.delete_many(paths)
            except Exception as exc:  # noqa: BLE001 - orphan cleanup (table maintenance) removes it
                log.warning("flinkish.iceberg: could not delete %d unused metadata files: %s", len(paths), exc)

        return delete

    def last_committed_epoch(self) -> int:
        """The newest epoch of this uid in any target the route can name (-1: none): the catalog's tables in
        the namespaces the route can name, each read from the catalog (its snapshots' ``flinkish.uid`` /
        ``flinkish.epoch``). Asked only at a query's start when the sink's metadata is missing or belongs to
        another Spark query (:mod:`flinkish_spark.sink.incarnation`)."""
        pyiceberg()
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        catalog = self.catalog()
        templates = self.route.templates() if isinstance(self.route, Routes) else (self.route.template,)
        depth = max(t.count(".") for t in templates)  # namespace levels: every dot but the name's (route rules too)
        namespaces: list[tuple[str, ...]] = [()]
        every: list[tuple[str, ...]] = []
        for _ in range(depth):
            below: list[tuple[str, ...]] = []
            for ns in namespaces:
                try:
                    below += [tuple(n) for n in catalog.list_namespaces(ns)]
                except NoSuchNamespaceError:
                    continue
            namespaces = below
            every += below
        best = -1
        for ns in every:
            try:
                identifiers = catalog.list_tables(ns)
            except NoSuchNamespaceError:
                continue
            for identifier in identifiers:
                name = ".".join(identifier)
                if not self.route.matches(name):
                    continue
                try:
                    best = max(best, committed_epoch(catalog.load_table(name), self.uid))
                except NoSuchTableError:
                    continue  # dropped meanwhile
        return best

    def figures(self, committables: list[RoutedCommittable]) -> dict[str, Any]:
        return epoch_figures(p for c in committables for p in c.parts)

    # -- abort / cleanup (driver) ----------------------------------------------------------------

    def abort(self, committables: list[RoutedCommittable], epoch: int) -> None:
        for c in committables:
            for p in c.parts:
                if p.keyed is not None:
                    self.io_for(p.location).delete_many(p.keyed.paths())

    def cleanup(self, epoch: int, keep: list[RoutedCommittable]) -> None:
        """Per table the decision names: files of the epoch's folder that the table does not name (it has
        the epoch) or that no kept part names (it does not yet). Tables no decided part names are not
        listed: the per-epoch cost stays with the tables the epoch changed."""
        for t in self._tables(keep):
            locations = {p.location for p in t.parts if p.location}
            table = self.load_target(self.route.target(t.table))
            if table is not None:
                locations.add(table.location())
            for location in locations:
                io = self.io_for(location)
                info = TableInfo(location, "", "", ())
                folder = epoch_folder(info, self.uid, epoch)
                on_storage = io.find(folder)
                if not on_storage:
                    continue
                if table is not None and committed_epoch(table, self.uid) >= epoch:
                    added = files_added_by(table, self.uid, epoch)
                    if added is None:
                        continue  # the epoch is in an expired snapshot: its files are unknown, never delete by listing
                    wanted = {io.strip(p) for p in added}
                else:
                    wanted = {io.strip(f) for k in t.keyed() for f in k.paths()}
                io.delete_many([io.url(p) for p in on_storage if p not in wanted])
                io.remove_empty_dirs(folder)
