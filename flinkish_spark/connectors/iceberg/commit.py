"""One Iceberg snapshot per call -- an append, a row delta with position delete files, or a
rewrite -- at a cost that does not grow with the table's history.

pyiceberg's ``Transaction`` re-applies its staged updates to a deep copy of the whole
table metadata every time its ``table_metadata`` is read -- about fifteen times per
fast-append commit -- so a commit through it costs O(snapshots) with a large constant
(measured on local disk with at most ~110 snapshots kept: 46 ms per commit at epoch 10,
560 ms at epoch 500, three quarters of it in ``copy.deepcopy``), and its fast append adds
one manifest per commit to an ever longer manifest list. :func:`append_snapshot` builds
the same snapshot with pyiceberg's own manifest and manifest-list writers and hands the
updates to ``Catalog.commit_table`` once:

* **One commit, optimistic.** The updates (add the snapshot, move ``main``, and expire
  old snapshots) carry the requirement ``assert-ref-snapshot-id(main = the parent we
  read)``; a concurrent writer makes the catalog refuse the commit with
  ``CommitFailedException``, and the caller re-reads and re-checks. Nothing is ever
  committed on top of a table state the caller has not seen.
* **Manifests merged** (Iceberg's ``commit.manifest-merge.enabled``, default true here,
  ``commit.manifest.min-count-to-merge`` default 100, ``commit.manifest.target-size-bytes``
  default 8 MB): when the parent lists at least min-count small manifests of the
  partition spec, the new data files and those manifests' live entries are rewritten
  into manifests of up to the target size. The manifest list stays at most ~min-count
  long, and every entry is rewritten only until its manifest reaches the target size.
* **Snapshots expired in the same commit** (``retain``): all but the newest ``retain``
  snapshots, except the snapshots that refs point to and the newest snapshot of every
  ``protect_property`` value (a flinkish uid's idempotence record). The expired
  snapshots' manifest lists are deleted after the commit (a manifest list belongs to one
  snapshot); data files and manifests stay (appends never remove data; a manifest may
  still be listed by a kept snapshot -- orphan cleanup is table maintenance).
* Old metadata files are deleted after the commit when the table sets
  ``write.metadata.delete-after-commit.enabled`` (as ``Table`` does).

* **Row deltas** (:class:`Changes`): the same snapshot can add data files, add position
  delete files (in *delete manifests*, manifest content 1) and remove live data or delete
  files (their manifests are rewritten with the removed entries as ``DELETED`` and the rest
  as ``EXISTING``, sequence numbers kept). New entries inherit the snapshot's sequence
  number, so a position delete applies to data files of this and earlier snapshots only
  (the spec: data sequence number <= the delete's). The operation follows Java Iceberg's
  ``BaseRowDelta``/``RewriteFiles``: ``append`` when only data files are added (or nothing
  at all: a marker snapshot), ``delete`` when only delete files are added, ``replace`` for
  a rewrite, ``overwrite`` otherwise.

Format versions 1 and 2 (pyiceberg writes no v3 manifests); delete files need version 2.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

MERGE_ENABLED = "commit.manifest-merge.enabled"
MIN_COUNT_TO_MERGE = "commit.manifest.min-count-to-merge"
TARGET_SIZE = "commit.manifest.target-size-bytes"
DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"
DEFAULT_MIN_COUNT_TO_MERGE = 100
DEFAULT_TARGET_SIZE = 8 * 1024 * 1024


@dataclass(frozen=True)
class MergePolicy:
    enabled: bool = True
    min_count: int = DEFAULT_MIN_COUNT_TO_MERGE
    target_size: int = DEFAULT_TARGET_SIZE

    @classmethod
    def of(cls, properties: dict[str, str]) -> "MergePolicy":
        """The table's own merge properties; merging is on unless the table turns it off."""
        return cls(properties.get(MERGE_ENABLED, "true").strip().lower() != "false",
                   max(2, int(properties.get(MIN_COUNT_TO_MERGE, DEFAULT_MIN_COUNT_TO_MERGE))),
                   int(properties.get(TARGET_SIZE, DEFAULT_TARGET_SIZE)))


def supported(table: Any) -> bool:
    return int(table.metadata.format_version) in (1, 2)


@dataclass(frozen=True)
class Changes:
    """What one snapshot does to the live files of ``main``."""

    data_files: Sequence[Any] = ()  # pyiceberg DataFiles (content DATA) to add
    delete_files: Sequence[Any] = ()  # pyiceberg DataFiles (content POSITION_DELETES) to add
    # Live files to remove, by the path of the manifest (of the parent snapshot) that lists them.
    removed: Mapping[str, frozenset[str]] = field(default_factory=dict)
    rewrite: bool = False  # a compaction: the table's rows stay the same

    def operation(self) -> str:
        if self.rewrite:
            return "replace"
        if not self.removed and not self.delete_files:
            return "append"  # also the marker snapshot of an epoch that changed nothing
        if not self.removed and not self.data_files:
            return "delete"
        return "overwrite"


def append_snapshot(catalog: Any, table: Any, data_files: list[Any], spec_id: int, properties: dict[str, str],
                    retain: int = 0, protect_property: str | None = None,
                    delete_files: Callable[[list[str]], None] | None = None) -> Any:
    """Commit one ``append`` snapshot with ``data_files``: :func:`commit_snapshot` with data files only."""
    return commit_snapshot(catalog, table, Changes(data_files=data_files), spec_id, properties, retain,
                           protect_property, delete_files)


def commit_snapshot(catalog: Any, table: Any, changes: Changes, spec_id: int, properties: dict[str, str],
                    retain: int = 0, protect_property: str | None = None,
                    delete_files: Callable[[list[str]], None] | None = None) -> Any:
    """Commit one snapshot with ``changes`` on top of ``table``'s ``main``; return the new table.

    Raises pyiceberg's ``CommitFailedException`` when ``main`` moved since ``table`` was
    read: nothing of ours is then in the table, and the files this call wrote are
    deleted. Any other error of the catalog commit leaves them: the commit may have
    happened (``CommitStateUnknownException``), and then the snapshot names them.
    ``delete_files`` (default: the table's FileIO, one file at a time) deletes files
    that are no longer needed; it must not raise.
    """
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus, write_manifest_list
    from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
    from pyiceberg.table.snapshots import Operation, Snapshot, SnapshotSummaryCollector, Summary
    from pyiceberg.table.update import (
        AddSnapshotUpdate,
        AssertRefSnapshotId,
        RemoveSnapshotsUpdate,
        SetSnapshotRefUpdate,
    )

    metadata = table.metadata
    if changes.delete_files and metadata.format_version < 2:
        raise ValueError(f"delete files need a format version 2 table, {table.name()} has {metadata.format_version}")
    io = table.io
    schema = metadata.schema()
    spec = metadata.specs()[spec_id]
    snapshot_id = metadata.new_snapshot_id()
    parent = metadata.snapshot_by_name(MAIN_BRANCH)
    parent_id = parent.snapshot_id if parent is not None else None
    sequence_number = metadata.next_sequence_number()
    compression = metadata.properties.get("write.avro.compression-codec", "gzip")
    locations = table.location_provider()
    delete = delete_files or (lambda paths: _delete_quietly(io, paths))
    commit_uuid = uuid.uuid4()
    written: list[str] = []
    counter = iter(range(1 << 30))

    def new_manifest(content: Any, manifest_spec: Any = spec) -> Any:
        path = locations.new_metadata_location(f"{commit_uuid}-m{next(counter)}.avro")
        written.append(path)
        return _manifest_writer(content, metadata.format_version, manifest_spec, schema, io.new_output(path),
                                snapshot_id, compression)

    def added(files: Sequence[Any]) -> list[Any]:
        return [ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=snapshot_id, sequence_number=None,
                                        file_sequence_number=None, data_file=f) for f in files]

    collector = SnapshotSummaryCollector(
        partition_summary_limit=int(metadata.properties.get("write.summary.partition-limit", "0")))
    for f in (*changes.data_files, *changes.delete_files):
        collector.add_file(f, schema=schema, partition_spec=spec)
    existing = parent.manifests(io) if parent is not None else []
    policy = MergePolicy.of(metadata.properties)
    try:
        manifests, removed = _without_removed(existing, changes.removed, new_manifest, io, metadata.specs())
        if sum(len(paths) for paths in changes.removed.values()) != len(removed):
            raise ValueError(f"files to remove are not live in snapshot {parent_id} of {table.name()}")
        for f in removed:
            collector.remove_file(f, schema=schema, partition_spec=metadata.specs()[f.spec_id])
        fresh = {m.manifest_path for m in manifests if m.added_snapshot_id == snapshot_id}
        manifests = [
            *_with_added(ManifestContent.DATA, added(changes.data_files), manifests, policy, spec_id, fresh,
                         new_manifest, io),
            *_with_added(ManifestContent.DELETES, added(changes.delete_files), manifests, policy, spec_id, fresh,
                         new_manifest, io),
        ]
        summary = _summary(changes.operation(), collector.build(), properties, parent)
        list_path = locations.new_metadata_location(f"snap-{snapshot_id}-0-{commit_uuid}.avro")
        written.append(list_path)
        with write_manifest_list(format_version=metadata.format_version, output_file=io.new_output(list_path),
                                 snapshot_id=snapshot_id, parent_snapshot_id=parent_id,
                                 sequence_number=sequence_number, avro_compression=compression) as list_writer:
            list_writer.add_manifests(manifests)
        # pyiceberg's models take field names at run time; mypy's pydantic view knows only
        # the aliases, hence the keyword dicts.
        fields: dict[str, Any] = dict(snapshot_id=snapshot_id, parent_snapshot_id=parent_id, manifest_list=list_path,
                                      sequence_number=sequence_number, summary=summary,
                                      schema_id=metadata.current_schema_id)
        ref: dict[str, Any] = dict(snapshot_id=snapshot_id, ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH)
        updates: tuple[Any, ...] = (AddSnapshotUpdate(snapshot=Snapshot(**fields)), SetSnapshotRefUpdate(**ref))
        doomed = expired_snapshots(metadata, retain, protect_property) if retain else []
        if doomed:
            removed_ids: dict[str, Any] = dict(snapshot_ids=[s.snapshot_id for s in doomed])
            updates += (RemoveSnapshotsUpdate(**removed_ids),)
        parent_ref: dict[str, Any] = dict(snapshot_id=parent_id, ref=MAIN_BRANCH)
    except BaseException:
        delete(written)  # nothing names them: the commit was never asked for
        raise
    try:
        response = catalog.commit_table(table, (AssertRefSnapshotId(**parent_ref),), updates)
    except CommitFailedException:
        delete(written)  # refused: nothing names them
        raise
    old = table.metadata
    table.metadata, table.metadata_location = response.metadata, response.metadata_location
    # After the commit only: these files belong to snapshots or metadata versions that are gone.
    gone = [s.manifest_list for s in doomed]
    if old.properties.get(DELETE_AFTER_COMMIT, "false").strip().lower() == "true":
        kept = {e.metadata_file for e in response.metadata.metadata_log}
        gone += [e.metadata_file for e in old.metadata_log if e.metadata_file not in kept]
    delete(gone)
    return table


def _manifest_writer(content: Any, format_version: Any, spec: Any, schema: Any, output: Any, snapshot_id: int,
                     compression: Any) -> Any:
    """pyiceberg's manifest writer; for delete files a version 2 writer that says so (pyiceberg writes data manifests only)."""
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2, write_manifest

    if content == ManifestContent.DATA:
        return write_manifest(format_version=format_version, spec=spec, schema=schema, output_file=output,
                              snapshot_id=snapshot_id, avro_compression=compression)

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> Any:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    return DeleteManifestWriter(spec, schema, output, snapshot_id, compression)


def _without_removed(manifests: list[Any], removed: Mapping[str, frozenset[str]], new_manifest: Callable[..., Any],
                     io: Any, specs: dict[int, Any]) -> tuple[list[Any], list[Any]]:
    """The parent's manifests with ``removed`` files marked deleted (their manifests rewritten), and the
    removed files. Manifests that list no live file any more are dropped, as Java Iceberg does."""
    from pyiceberg.manifest import ManifestEntryStatus

    kept: list[Any] = []
    gone: list[Any] = []
    for m in manifests:
        paths = removed.get(m.manifest_path)
        if not paths:
            if (m.added_files_count or 0) + (m.existing_files_count or 0) > 0 or m.added_files_count is None:
                kept.append(m)
            continue
        with new_manifest(m.content, specs[m.partition_spec_id]) as writer:
            for entry in m.fetch_manifest_entry(io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.DELETED:
                    continue
                if entry.data_file.file_path in paths:
                    writer.delete(entry)
                    gone.append(entry.data_file)
                else:
                    writer.existing(entry)
        kept.append(writer.to_manifest_file())
    return kept, gone


def _with_added(content: Any, entries: list[Any], manifests: list[Any], policy: MergePolicy, spec_id: int,
                fresh: set[str], new_manifest: Callable[..., Any], io: Any) -> list[Any]:
    """The manifests of one content type with ``entries`` added: in a new manifest, or merged with the
    small manifests of the spec when they reach the min-count. Manifests this commit rewrote
    (``fresh``: they record its removals) are never merged away."""
    same = [m for m in manifests if m.content == content]
    small = [m for m in same if m.partition_spec_id == spec_id and m.manifest_length < policy.target_size
             and m.manifest_path not in fresh]
    if policy.enabled and len(small) + (1 if entries else 0) >= policy.min_count:
        merged = set(id(m) for m in small)
        return [*_merge(lambda: new_manifest(content), entries, _bins(small, policy.target_size), io),
                *(m for m in same if id(m) not in merged)]
    if not entries:
        return same
    with new_manifest(content) as writer:
        for entry in entries:
            writer.add_entry(entry)
    return [writer.to_manifest_file(), *same]


def _summary(operation: str, added: dict[str, str], properties: dict[str, str], parent: Any) -> Any:
    """The snapshot summary with the table totals carried on (pyiceberg computes them for append,
    overwrite and delete only; a rewrite's totals are computed as an overwrite's)."""
    from pyiceberg.table.snapshots import Operation, Summary, update_snapshot_summaries

    op = Operation(operation)
    counted = Operation.OVERWRITE if op == Operation.REPLACE else op
    summary = update_snapshot_summaries(Summary(operation=counted, **added, **properties),
                                        previous_summary=parent.summary if parent is not None else None)
    if op == counted:
        return summary
    return Summary(operation=op, **summary.additional_properties)


def expired_snapshots(metadata: Any, retain: int, protect_property: str | None) -> list[Any]:
    """Snapshots to expire when one more is added: all but the newest ``retain`` (counting the
    new one), never one a ref points to, never the newest of each ``protect_property`` value."""
    snapshots = sorted(metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True)
    if len(snapshots) < retain:
        return []
    protected = {s.snapshot_id for s in snapshots[:max(retain - 1, 0)]}
    protected.update(ref.snapshot_id for ref in metadata.refs.values())
    if protect_property:
        seen: set[str] = set()
        for s in snapshots:
            value = (s.summary.additional_properties if s.summary is not None else {}).get(protect_property)
            if value is not None and value not in seen:
                seen.add(value)
                protected.add(s.snapshot_id)
    return [s for s in snapshots if s.snapshot_id not in protected]


def _bins(manifests: list[Any], target: int) -> list[list[Any]]:
    """Consecutive groups of manifests of at most ``target`` bytes (the first also takes the new files)."""
    bins: list[list[Any]] = [[]]
    size = 0
    for m in manifests:
        if bins[-1] and size + m.manifest_length > target:
            bins.append([])
            size = 0
        bins[-1].append(m)
        size += m.manifest_length
    return bins


def _merge(new_manifest: Any, added: list[Any], bins: list[list[Any]], io: Any) -> Iterable[Any]:
    from pyiceberg.manifest import ManifestEntryStatus

    for i, group in enumerate(bins):
        if i and len(group) == 1:
            yield group[0]  # nothing to merge it with
            continue
        live = [e for m in group for e in m.fetch_manifest_entry(io, discard_deleted=True)
                if e.status != ManifestEntryStatus.DELETED]
        if not live and not (added if i == 0 else ()):
            continue  # nothing live left in these manifests
        with new_manifest() as writer:
            for entry in added if i == 0 else ():
                writer.add_entry(entry)
            for entry in live:
                writer.existing(entry)
        yield writer.to_manifest_file()


def _delete_quietly(io: Any, paths: Iterable[str]) -> None:
    for path in paths:
        try:
            io.delete(path)
        except Exception:  # noqa: BLE001 - a leftover file is harmless; maintenance removes orphans
            pass
