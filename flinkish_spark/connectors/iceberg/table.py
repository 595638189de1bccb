"""The sink's table: created or validated on the driver before any task writes, and the
idempotence record (``flinkish.uid``/``flinkish.epoch`` in snapshot summaries) read back.

A table the sink creates gets the query's schema (:mod:`.schema`), identity partitions,
and :data:`CREATED_TABLE_PROPERTIES`. An existing table must have the same columns and
partition columns, else :class:`~flinkish_spark.errors.TableMismatchError` -- before any
file is written.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from flinkish_spark.connectors.iceberg.catalog import names_holding, pyiceberg
from flinkish_spark.connectors.iceberg.commit import DELETE_AFTER_COMMIT, MERGE_ENABLED, supported
from flinkish_spark.connectors.iceberg.schema import shape
from flinkish_spark.errors import TableMismatchError

UID_PROPERTY = "flinkish.uid"
EPOCH_PROPERTY = "flinkish.epoch"
PARTITION_FIELD_ID_START = 1000
# Properties of tables the sink creates: merged manifests and no pile of old metadata
# files, for every writer of the table (Java Iceberg's defaults for streaming tables).
CREATED_TABLE_PROPERTIES = {MERGE_ENABLED: "true", DELETE_AFTER_COMMIT: "true"}


def keyed_properties(merge_mode: str) -> dict[str, str]:
    """Properties of tables the sink creates for a keyed mode: format version 2 (position deletes), and
    the same merge mode for other writers (Spark's MERGE/UPDATE/DELETE read these)."""
    how = "merge-on-read" if merge_mode == "mergeOnRead" else "copy-on-write"
    return {"format-version": "2", "write.delete.mode": how, "write.update.mode": how, "write.merge.mode": how}


@dataclass(frozen=True)
class TableInfo:
    """What executors need to write files for a table, without a catalog."""

    location: str
    schema_json: str
    spec_json: str
    properties: tuple[tuple[str, str], ...]


def info_of(table: Any) -> TableInfo:
    return TableInfo(table.location(), table.schema().model_dump_json(), table.spec().model_dump_json(),
                     tuple(sorted(table.properties.items())))


def ensure_table(catalog: Any, catalog_name: str, identifier: str, wanted: Any, partition_by: tuple[str, ...],
                 create: bool, component: str, properties: dict[str, str] | None = None) -> Any:
    """Load ``identifier`` -- or create it with the Iceberg schema ``wanted`` -- and check it fits the query."""
    pyiceberg()
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        elsewhere = names_holding(catalog, identifier)
        if elsewhere:
            raise TableMismatchError(
                f"{component}: the Iceberg table {identifier!r} is not filed under the catalog name {catalog_name!r}, "
                f"but this catalog's database has it under {elsewhere}: a SQL catalog keeps its tables per catalog "
                f"name. Set the option 'catalogName' to {elsewhere[0]!r} to write to that table."
            ) from None
        if not create:
            raise TableMismatchError(
                f"{component}: the Iceberg table {identifier!r} does not exist in the catalog "
                f"{catalog_name!r} and createTable is false; create it first or set createTable to true"
            ) from None
        spec = PartitionSpec(*[
            PartitionField(wanted.find_field(c).field_id, PARTITION_FIELD_ID_START + i, IdentityTransform(), c)
            for i, c in enumerate(partition_by)
        ])
        namespace = identifier.rsplit(".", 1)[0]
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        try:
            catalog.create_table(identifier, schema=wanted, partition_spec=spec,
                                 properties={**CREATED_TABLE_PROPERTIES, **(properties or {})})
        except TableAlreadyExistsError:  # another query created it at the same moment
            pass
        table = catalog.load_table(identifier)
    if not supported(table):
        raise TableMismatchError(
            f"{component}: the Iceberg table {identifier!r} has format version "
            f"{table.metadata.format_version}; pyiceberg writes manifests for versions 1 and 2 only"
        )
    have = table.schema()
    if shape(have) != shape(wanted):
        raise TableMismatchError(
            f"{component}: the Iceberg table {identifier!r} has the schema {shape(have)}, but the query "
            f"writes {shape(wanted)}. Write to a new table, or select and cast the columns to the table's schema."
        )
    parts = []
    for field in table.spec().fields:
        if str(field.transform) != "identity":
            parts.append(f"{field.transform}({have.find_column_name(field.source_id)})")
        else:
            parts.append(have.find_column_name(field.source_id))
    if tuple(parts) != partition_by:
        raise TableMismatchError(
            f"{component}: the Iceberg table {identifier!r} is partitioned by {parts}, but the option "
            f"'partitionBy' asks for {list(partition_by)}. Use the table's identity partition columns."
        )
    return table


def committed_epoch(table: Any, uid: str) -> int:
    """The newest epoch ``uid`` committed, walking the ancestry only back to it (-1: none)."""
    from pyiceberg.table.snapshots import ancestors_of

    def epoch_of(snapshot: Any) -> int | None:
        props = snapshot.summary.additional_properties if snapshot.summary is not None else {}
        return int(props.get(EPOCH_PROPERTY, -1)) if props.get(UID_PROPERTY) == uid else None

    for snapshot in ancestors_of(table.current_snapshot(), table.metadata):
        found = epoch_of(snapshot)
        if found is not None:
            return found
    # The chain can end early where expiry removed other writers' snapshots (retainSnapshots
    # keeps each uid's newest one, but not the links to it): look at every snapshot.
    return max((e for e in map(epoch_of, table.snapshots()) if e is not None), default=-1)


def files_added_by(table: Any, uid: str, epoch: int) -> list[str] | None:
    """Paths of the files that the retained snapshots of (``uid``, ``epoch``) added; None when there are none."""
    from pyiceberg.manifest import ManifestEntryStatus

    snapshots = [s for s in table.snapshots() if s.summary is not None
                 and s.summary.additional_properties.get(UID_PROPERTY) == uid
                 and s.summary.additional_properties.get(EPOCH_PROPERTY) == str(epoch)]
    if not snapshots:
        return None
    out = []
    for snap in snapshots:
        for m in snap.manifests(table.io):
            if m.added_snapshot_id != snap.snapshot_id:
                continue
            out += [e.data_file.file_path for e in m.fetch_manifest_entry(table.io, discard_deleted=False)
                    if e.status == ManifestEntryStatus.ADDED and e.snapshot_id == snap.snapshot_id]
    return out


class TableCache:
    """The table as this process last committed or read it, per (catalog, table, uid): a commit
    starts from it instead of loading the metadata again; when another writer moved the
    table, the commit's requirement fails and the table is loaded afresh."""

    _tables: dict[tuple[str, str, str], Any] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, key: tuple[str, str, str]) -> Any:
        with cls._lock:
            return cls._tables.get(key)

    @classmethod
    def put(cls, key: tuple[str, str, str], table: Any) -> None:
        with cls._lock:
            cls._tables[key] = table

    @classmethod
    def forget(cls, key: tuple[str, str, str]) -> None:
        with cls._lock:
            cls._tables.pop(key, None)
