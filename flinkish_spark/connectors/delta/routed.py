"""``flinkish.delta`` with ``{schema}``/``{table}`` in ``path``: the multi-table stream, one keyed Delta table per source table.

* **Prepare** (executors): a task splits its rows per table
  (:func:`~flinkish_spark.connectors.postgres.rows.split_tables`: typed with the table's schema
  of each row), and for each table writes what the keyed prepare writes for one table
  (:func:`~flinkish_spark.connectors.delta.keyed.prepare_keyed`: files below the table's
  ``flinkish/<uid>/e<epoch>/`` and the task's entries), plus the task's newest schema of the
  table, a truncate and re-snapshot markers (:class:`RoutedPart`). Nothing reads a target here.
* **Commit** (driver, after the decision names every table's part): first, for every table
  the epoch changed and that does not hold the epoch yet, the target's evolution is computed
  (:mod:`flinkish_spark.connectors.delta.evolve`) -- a change it cannot follow raises
  :class:`~flinkish_spark.errors.SchemaChangeError` before any table is written. Then one
  Delta version per table: an evolved schema's ``metaData`` action, the keyed commit's actions
  (a truncate removes every live file first; a re-snapshot's end deletes the rows it did not
  deliver) and ``txn(appId = uid, version = epoch)`` -- the first table (by name) alone, then
  the others: on object storage :data:`COMMIT_THREADS` at a time (independent logs: the time is
  requests' latency, overlapped by threads); on a local disk one after another, their versions staged
  behind one sync of the file system (:mod:`.version_writes`; the epoch's files are durable before any
  version names them, every version before ``.done``: :mod:`flinkish_spark.io.local_disk`). With ``commitProcesses`` = P > 0 the same steps run in
  P committer processes, each table always in the same one (:mod:`flinkish_spark.connectors.delta.committers`:
  the evolution checks, the first table alone, the rest).
* **Exactly once across tables**: each table's txn makes its commit idempotent on its own. A
  restart commits the decided epoch again: tables whose txn is >= the epoch are skipped (a
  table's txn moves only when the table changes, and epochs commit in order, so a txn at a
  later epoch means this one is in it), the others are committed. Crash point
  ``sink.between_tables``: after the first table's version, before the next.
* **Recreated targets, reset checkpoints**: each target is a
  :class:`~flinkish_spark.connectors.delta.live.LiveTarget` -- a target folder deleted and created
  again drops every cache of it (the head's digest check) -- and the sink's
  :meth:`RoutedDeltaSink.last_committed_epoch` is the newest txn of the uid in any Delta table
  below the route's pattern (:mod:`flinkish_spark.sink.incarnation` asks it at start).
* **Cost**: only the tables in the epoch's rows are touched; a table that did not change gets
  no read, no commit and no marker. Each table checkpoints every ``checkpointInterval`` versions
  at its own offset (:func:`checkpoint_offset`), so tables changing together spread their
  checkpoints over the interval's epochs instead of all writing one in the same epoch.
* **Modes** (``mode`` / ``deletes`` / ``tableModes``, per table:
  :mod:`~flinkish_spark.connectors.lakehouse.table_modes`): each table's plan is its mode's
  (:func:`~flinkish_spark.connectors.lakehouse.routing.table_plan`); the target is created with the
  mode's columns and checked against them (:mod:`.evolve`); a truncate or a re-snapshot's end deletes,
  marks (``_deleted``), closes (history) or keeps the rows it takes
  (:func:`~flinkish_spark.connectors.lakehouse.routed_modes.gone_rows_as`), in the epoch's one version.
* **Partitions** (a ``tableModes`` rule's ``partitionBy``): the target is created with those
  ``partitionColumns``; every file written for it holds one partition's rows (the columns kept in the file:
  :func:`~flinkish_spark.connectors.lakehouse.files.write_grouped`); an existing target of another
  partitioning is refused before anything is written (:mod:`.evolve`), never changed.
* **Compaction** (``compactEvery`` = N, default 0: off): a table is compacted right after the
  commit that brings it to a version v with (v + offset) % N == 0 -- about every N of its own
  commits (the compaction's version counts as one), at an offset of its own (:func:`checkpoint_offset`
  of the path mod N), so a table that changes in few epochs is still compacted, and tables that
  change in every epoch compact ~1/N of them per epoch. It is the one-table sink's compaction
  (:mod:`flinkish_spark.connectors.delta.compaction`: a version of its own, ``dataChange = false``,
  abandoned when a concurrent commit touched its files), in the table's commit thread. A crash
  before or after its version loses nothing: the restart finds the table holding the epoch and
  skips it (the compaction comes at the table's next due version), and the epoch's cleanup deletes
  the compaction's files the table does not name.
"""

from __future__ import annotations

import base64
import json
import logging
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator

import pyarrow as pa

from flinkish_spark.connectors.delta import committers, routed_shards
from flinkish_spark.connectors.delta.committables import KeyedCommittable, decode_keyed, encode_keyed
from flinkish_spark.connectors.delta.epoch_commit import EpochExtra
from flinkish_spark.connectors.delta.evolve import RoutedDeltaTarget, schema_actions
from flinkish_spark.connectors.delta.keyed import keyed_steps, prepare_keyed
from flinkish_spark.connectors.delta.resnapshot import Resnapshots
from flinkish_spark.connectors.delta.state import DeltaState
from flinkish_spark.connectors.delta.table import DEFAULT_CHECKPOINT_INTERVAL, DeltaTarget
from flinkish_spark.connectors.delta.version_writes import Steps, write_now, write_staged
from flinkish_spark.connectors.lakehouse.changes import COMMIT_TS, LSN, OP, UNCHANGED, MergeMode
from flinkish_spark.connectors.lakehouse.files import DEFAULT_ROWS_PER_FILE, DEFAULT_TARGET_FILE_SIZE
from flinkish_spark.connectors.lakehouse.figures import Figures, epoch_figures
from flinkish_spark.connectors.lakehouse.routed_modes import close_time_us, gone_rows_as
from flinkish_spark.connectors.lakehouse.routing import (
    Route, TableEpoch, TablePart, table_plan, tables_of, task_tables, truncates_as_deletes,
)
from flinkish_spark.connectors.lakehouse.routes import Routes
from flinkish_spark.connectors.lakehouse.table_modes import UPSERT, TableModes
from flinkish_spark.connectors.lakehouse.transform.hooks import transformed
from flinkish_spark.connectors.lakehouse.transform.rules import Transforms
from flinkish_spark.connectors.postgres.rows import TableSchema
from flinkish_spark.faults import crash_point
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.io.local_disk import sync_file_systems
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

log = logging.getLogger(__name__)

ROUTED_MAGIC = b"FRD1"
#: Tables of one epoch committed at once on object storage (after the first one, see :meth:`RoutedDeltaSink.commit`).
COMMIT_THREADS = 8


def staged_writes(io: FileIO) -> bool:
    """Whether an epoch's tables (after the first) have their versions staged behind one sync of the file system
    (:func:`~.version_writes.write_staged`: a local disk, where a table's commit is Python work plus fsyncs that
    queue behind one journal -- threads only slowed it down, 1.3-1.45x with 8 on an idle 2-core machine), or are
    committed :data:`COMMIT_THREADS` at a time (object storage: a table's time is requests' latency)."""
    return io.is_local


@dataclass(frozen=True)
class RoutedPart(TablePart):
    """One table's share of one task: :class:`~flinkish_spark.connectors.lakehouse.routing.TablePart` and the keyed files."""

    keyed: KeyedCommittable | None


@dataclass(frozen=True)
class RoutedCommittable:
    partition: int
    parts: tuple[RoutedPart, ...]


def encode_routed(c: RoutedCommittable) -> bytes:
    parts = [{"table": p.table, "schema": p.schema, "lsn": p.lsn, "truncate": p.truncate, "begin": p.begin,
              "end": p.end, "keyed": None if p.keyed is None else base64.b64encode(encode_keyed(p.keyed)).decode(),
              "n": p.figures.to_json(), **({"earlier": list(p.earlier)} if p.earlier else {}),
              **({"tt": p.truncate_us} if p.truncate_us >= 0 else {})}
             for p in c.parts]
    return ROUTED_MAGIC + json.dumps({"partition": c.partition, "parts": parts}, separators=(",", ":")).encode()


def decode_routed(data: bytes) -> RoutedCommittable:
    d = json.loads(data[len(ROUTED_MAGIC):])
    return RoutedCommittable(int(d["partition"]), tuple(
        RoutedPart(p["table"], p["schema"], int(p["lsn"]), bool(p["truncate"]), bool(p["begin"]), bool(p["end"]),
                   None if p["keyed"] is None else decode_keyed(base64.b64decode(p["keyed"])),
                   earlier=tuple(p.get("earlier", ())), figures=Figures.from_json(p.get("n")),
                   truncate_us=int(p.get("tt", -1)))
        for p in d["parts"]))


def checkpoint_offset(path: str, interval: int) -> int:
    """A target's checkpoint offset: a stable hash of its path (the same in every process and run) mod the interval.

    Tables that change in every epoch reach the multiples of the interval together: with one
    offset for all, each of them would write its checkpoint (delta-rs, 6-8 ms on local disk) in the same
    epoch -- +5-10 ms per table there, docs/benchmarks.md. Spread, an epoch carries ~1/interval of them."""
    return zlib.crc32(path.encode()) % interval if interval else 0


class RoutedDeltaSink(TwoPhaseCommitSink[RoutedCommittable]):
    #: Columns and rows chosen per table (option ``transforms``), applied to each task's rows before anything else.
    transforms: Transforms = Transforms()

    def __init__(self, io: FileIO, route: Route, uid: str, merge_mode: MergeMode = "mergeOnRead",
                 checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                 target_file_size: int = DEFAULT_TARGET_FILE_SIZE, create_table: bool = True,
                 metadata_io: FileIO | None = None, metadata_dir: str | None = None, compact_every: int = 0,
                 modes: TableModes = TableModes(), commit_processes: int = 0) -> None:
        self.io, self.route, self.uid, self.merge_mode = io, route, uid, merge_mode
        self.commit_processes = commit_processes  # > 0: the tables' commits in committer processes (.committers)
        self.modes = modes
        self.compact_every = compact_every
        self.checkpoint_interval, self.rows_per_file, self.target_file_size = checkpoint_interval, rows_per_file, target_file_size
        self.create_table = create_table
        self.resnapshots = Resnapshots(metadata_io or io, metadata_dir) if metadata_dir else None
        self._committed_here: dict[str, dict[int, frozenset[str]]] = {}  # per source table, as DeltaTarget's

    def target(self, table: str, schema: TableSchema, columns: pa.Schema | None = None) -> RoutedDeltaTarget:
        """``columns``: the data columns of the rows to write when they are not the newest schema's
        (a column dropped within the epoch: the rows written before the drop keep its values)."""
        mode = self.modes.of(table)
        plan = table_plan(schema.arrow_schema() if columns is None else columns, schema.key, self.merge_mode, mode, table)
        mode.check_partitions(plan.table_schema.names, table)  # a rule's partitionBy (in the tasks and the commit)
        target = RoutedDeltaTarget(self.io, self.route.target(table), self.uid, plan.table_schema, mode.partition_by, plan,
                                   self.checkpoint_interval, self.compact_every, self.rows_per_file,
                                   self.target_file_size, source_table=routed_shards.label(self.route, table), mode=mode)
        target.checkpoint_offset = checkpoint_offset(target.path, self.checkpoint_interval)
        target.sync_version_folder = False  # commit() syncs the file system once per epoch instead
        if self.compact_every:  # counted in the table's versions, at its own offset (module docstring)
            target.compact_offset = checkpoint_offset(target.path, self.compact_every)
        return target

    # -- prepare (executors) -----------------------------------------------------------------

    def prepare(self, batches: Iterator[pa.RecordBatch], ctx: PrepareContext) -> RoutedCommittable | None:
        parts = []
        for name, schema, data in routed_shards.shard_tables(transformed(self.transforms, task_tables(batches)),
                                                             self.route):  # merged: + _source_table
            keyed = None
            # A mode that keeps what a truncate takes applies the changes before it too, the truncate a delete of them.
            changes = (truncates_as_deletes(data, schema.key) if data.truncate and self.modes.of(name).shape != UPSERT.shape
                       else data.changes)
            if changes.num_rows:
                columns = pa.schema([f for f in changes.schema if f.name not in (OP, LSN, COMMIT_TS, UNCHANGED)])
                target = self.target(name, schema, columns)
                keyed = prepare_keyed(target, iter(changes.to_batches()), ctx)
            parts.append(RoutedPart(name, schema.to_json(), data.lsn, data.truncate, data.begin, data.end, keyed,
                                    earlier=data.earlier, figures=data.figures, truncate_us=data.truncate_us))
        return RoutedCommittable(ctx.partition_id, tuple(parts)) if parts else None

    # -- commit (driver) -------------------------------------------------------------------------

    def _tables(self, committables: list[RoutedCommittable]) -> list[TableEpoch[RoutedPart]]:
        tables = tables_of((p for c in committables for p in c.parts), self.route, "path")
        return routed_shards.merged_tables(tables, self.route, self.modes.of, "Delta")  # one commit per merged target

    def commit(self, committables: list[RoutedCommittable], epoch: int) -> CommitOutcome:
        tables = self._tables(committables)
        if not self.io.is_local:
            return self._commit_epoch(tables, epoch)
        # A local disk: one sync of the file system before the first version (the tasks' files are durable before a
        # version names them) and one after the last (every version before .done), instead of a folder fsync per
        # version: io.local_disk has the argument. Committer processes write to the same page cache.
        paths = [self.io.strip(self.route.target(t.table)) for t in tables]
        sync_file_systems(paths, folders_too=False)
        outcome = self._commit_epoch(tables, epoch)
        sync_file_systems(f"{p}/_delta_log" for p in paths)
        return outcome

    def _commit_epoch(self, tables: list[TableEpoch[RoutedPart]], epoch: int) -> CommitOutcome:
        if self.commit_processes:  # the same order, in committer processes (module .committers)
            if self.resnapshots is not None:
                self.resnapshots.forget()  # the committers begin and end them now: a later in-process commit lists them
            return committers.commit_tables(self, tables, epoch, lambda: crash_point("sink.between_tables"))
        committers.close_pool(self.uid)  # committed here now: committers of an earlier commit would hold stale caches
        # Every table's evolution is checked before the first table is written: a change that
        # cannot be followed ends the query with nothing of the epoch visible.
        pending = [p for t in tables if (p := self._pending(t, epoch)) is not None]
        if not pending:
            return "COMMITTED"
        t, target, evolved = pending[0]
        outcome = self._commit_table(t, target, evolved, epoch)
        if outcome != "COMMITTED" or len(pending) == 1:
            return outcome
        crash_point("sink.between_tables")  # the first table has the epoch, the others not yet
        outcomes = self._commit_tables(pending[1:], epoch)
        return next((o for o in outcomes if o != "COMMITTED"), "COMMITTED")

    def _commit_tables(self, pending: list[tuple[TableEpoch[RoutedPart], RoutedDeltaTarget, tuple[Any, bool]]],
                       epoch: int) -> list[CommitOutcome]:
        """:meth:`_commit_table` of each (in order): on a local disk one after another, their versions staged behind
        one sync of the file system (:func:`~.version_writes.write_staged`); on object storage several at once --
        each table's version is independent (its own log, its own txn) and its time there is waiting on requests.
        Here and in each committer process (:mod:`.committers`)."""
        if staged_writes(self.io) and len(pending) > 1:  # one table alone: its own fsync is cheaper than a sync
            return write_staged([self._table_steps(t, target, evolved, epoch, staged=True)
                                 for t, target, evolved in pending], self.io)
        threads = min(COMMIT_THREADS, len(pending))
        if threads <= 1:
            return [self._commit_table(t, target, evolved, epoch) for t, target, evolved in pending]
        with ThreadPoolExecutor(threads, thread_name_prefix="flinkish-routed") as pool:
            return list(pool.map(lambda p: self._commit_table(p[0], p[1], p[2], epoch), pending))

    def _pending(self, t: TableEpoch[RoutedPart], epoch: int
                 ) -> tuple[TableEpoch[RoutedPart], RoutedDeltaTarget, tuple[Any, bool]] | None:
        """The table's target, evolution and whether it exists, when it does not hold the epoch yet (None: it does,
        a recovered commit). Raises :class:`~flinkish_spark.errors.SchemaChangeError` for a change the target
        cannot follow."""
        target = self.target(t.table, t.schemas()[-1])
        state = target.existing_state()
        if state is not None and state.txn(self.uid) >= epoch:
            return None
        return t, target, (target.evolution(state, t.steps()), state is not None)

    def _commit_table(self, t: TableEpoch[RoutedPart], target: RoutedDeltaTarget, evolved: tuple[Any, bool],
                      epoch: int) -> CommitOutcome:
        return write_now(self._table_steps(t, target, evolved, epoch), target.sync_version_folder)

    def _table_steps(self, t: TableEpoch[RoutedPart], target: RoutedDeltaTarget, evolved: tuple[Any, bool],
                     epoch: int, staged: bool = False) -> Steps:
        """One table's commit, yielding its version where it is written (:mod:`.version_writes`)."""
        evolution, exists = evolved
        created = target.ensure_created(evolution, self.create_table, exists)
        outcome = yield from keyed_steps(target, t.keyed(), epoch, self._extra(t, target, evolution, created, epoch),
                                         staged)
        if outcome not in ("COMMITTED", "ALREADY_COMMITTED"):
            return outcome
        self._committed_here[t.table] = target._committed_here  # the files its version named: cleanup spares them
        if t.end and self.resnapshots is not None:
            self.resnapshots.finish(target.path)
        if isinstance(t, routed_shards.MergedEpoch):
            routed_shards.finish_resnapshots(t, target, self.resnapshots)
        return "COMMITTED"

    def _extra(self, t: TableEpoch[RoutedPart], target: RoutedDeltaTarget, evolution: Any, created: bool, epoch: int) -> Any:
        if isinstance(t, routed_shards.MergedEpoch):  # each shard's truncate / re-snapshot takes only its rows
            return routed_shards.merged_extra(t, target, evolution, created, epoch, self.resnapshots)
        how = gone_rows_as(target.mode)
        truncate = t.truncate and not created

        def extra(state: DeltaState) -> EpochExtra:
            before = () if created else schema_actions(target, state, evolution)
            gone = None
            if how != "keep" and self.resnapshots is not None and (t.begin or t.end or self.resnapshots.active(target.path)):
                gone = self.resnapshots.step_delta(target, state, t.begin, t.end, t.keyed(), epoch)
            at = close_time_us(t.parts, truncate)  # when history closes what the epoch takes
            if truncate and how in ("soft", "close"):
                # Every row the epoch does not write again gets _deleted = true (soft) / its current version closed at
                # the truncate (history); the epoch's keys' rows are replaced as in any epoch (a history version by
                # the key's first change or the truncate, whichever came first).
                return EpochExtra(tuple(before), False, None, how, rest_gone=True, close_us=at,
                                  close_by_us=at if how == "close" else -1, routed=True)
            return EpochExtra(tuple(before), t.truncate and how == "delete", gone, how, close_us=at, routed=True)

        return extra

    # -- abort / cleanup (driver) ----------------------------------------------------------------

    def abort(self, committables: list[RoutedCommittable], epoch: int) -> None:
        urls = []
        for c in committables:
            for p in c.parts:
                if p.keyed is not None:
                    path = self.route.target(p.table)
                    urls += [f"{path}/{f}" for f in sorted(p.keyed.paths())]
        self.io.delete_many(urls)

    def cleanup(self, epoch: int, keep: list[RoutedCommittable]) -> None:
        """Per table the decision names, what :meth:`LiveTarget.cleanup_epoch` deletes for one table. Tables no
        decided part names are not listed: the per-epoch cost stays with the tables the epoch changed."""
        tables = self._tables(keep)
        if self.commit_processes:  # in the processes that committed them: their caches of the tables are warm
            committers.cleanup_tables(self, tables, epoch)
            return
        self._cleanup_tables(tables, epoch)

    def _cleanup_tables(self, tables: list[TableEpoch[RoutedPart]], epoch: int) -> None:
        for t in tables:
            target = self.target(t.table, t.schemas()[-1])
            target._committed_here = self._committed_here.get(t.table, {})
            target.cleanup_epoch(epoch, {f for k in t.keyed() for f in k.paths()})

    def last_committed_epoch(self) -> int:
        """The newest epoch of this uid in any target the route can name (-1: none): each Delta table below
        the route's pattern is read (delta-rs, its txn of the uid). Asked only at a query's start when the
        sink's metadata is missing or belongs to another Spark query (:mod:`flinkish_spark.sink.incarnation`)."""
        templates = self.route.templates() if isinstance(self.route, Routes) else (self.route.template,)
        stripped = [Route(self.io.strip(t), self.route.kind) for t in templates]
        logs = {p.rsplit("/_delta_log/", 1)[0] for t in templates for name in ("_last_checkpoint", "0" * 20 + ".json")
                for p in self.io.glob(f"{t.replace('{schema}', '*').replace('{table}', '*')}/_delta_log/{name}")}
        epochs = [DeltaTarget(self.io, self.io.url(p), self.uid, pa.schema([]), ()).last_committed_epoch()
                  for p in sorted(logs) if any(r.matches(p) for r in stripped)]
        return max(epochs, default=-1)

    def figures(self, committables: list[RoutedCommittable]) -> dict[str, Any]:
        return epoch_figures(p for c in committables for p in c.parts)

    def encode(self, committable: RoutedCommittable) -> bytes:
        return encode_routed(committable)

    def decode(self, data: bytes) -> RoutedCommittable:
        return decode_routed(data)

