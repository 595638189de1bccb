"""The live files of a Delta table, with their deletion vectors, kept up to date commit by commit.

A keyed commit needs what delta-rs does not expose: each live file's deletion vector
descriptor (its ``remove`` must name the old one, its ``add`` the new one) next to its
statistics. :class:`DeltaState` is that snapshot, built by the protocol's action
reconciliation: the newest checkpoint (classic, single or multi-part Parquet: what delta-rs
and Spark write) plus the JSON commits after it, then advanced by every commit the sink
writes or reads -- O(new commits) per epoch, the full O(live files) read only once per
process (and again after a metadata or protocol change).

Within one commit a file's ``remove`` and ``add`` (a deletion vector replaced) are
applied removes first: the protocol does not order actions within a commit, and the
pair means "this file, now with the new vector".
"""

from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow.parquet as pq

from flinkish_spark.connectors.delta.deletion_vectors import Descriptor
from flinkish_spark.connectors.delta.log import DeltaLog, TableChanged
from flinkish_spark.errors import CorruptMetadataError, TableMismatchError

_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_PRESERVED = ("tags", "baseRowId", "defaultRowCommitVersion", "clusteringProvider")


@dataclass
class LiveFile:
    """One logical file: a data file and (optionally) its deletion vector."""

    path: str  # as the log writes it (a URI-encoded path relative to the table root, or absolute)
    size: int
    modification_time: int
    partition_values: dict[str, str | None]
    stats: str | None
    dv: Descriptor | None
    extra: dict[str, Any] = field(default_factory=dict)  # preserved fields (tags, ...)
    _parsed: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def from_add(cls, add: dict[str, Any]) -> "LiveFile":
        dv = add.get("deletionVector")
        pv = add.get("partitionValues") or {}
        if isinstance(pv, list):  # a Parquet map read back as (key, value) pairs
            pv = dict(pv)
        extra = {k: add[k] for k in _PRESERVED if add.get(k) is not None}
        if isinstance(extra.get("tags"), list):
            extra["tags"] = dict(extra["tags"])
        return cls(str(add["path"]), int(add["size"]), int(add.get("modificationTime") or 0), dict(pv),
                   add.get("stats"), None if dv is None else Descriptor.from_json(dv), extra)

    @property
    def relative_path(self) -> str:
        """The decoded path (relative to the table root unless absolute)."""
        return urllib.parse.unquote(self.path)

    def parsed_stats(self) -> dict[str, Any]:
        if self._parsed is None:
            try:
                self._parsed = json.loads(self.stats) if self.stats else {}
            except ValueError:
                self._parsed = {}
        return self._parsed

    def stored_files(self) -> list[str]:
        """The files (relative, decoded) this logical file is stored in: the data file, and its DV file
        when the vector is in one below the table (``u``; a malformed descriptor names none)."""
        out = [self.relative_path]
        dv_file = None if self.dv is None else self.dv.stored_file()
        if dv_file:
            out.append(dv_file)
        return out

    @property
    def num_records(self) -> int | None:
        value = self.parsed_stats().get("numRecords")
        return None if value is None else int(value)

    @property
    def deleted_rows(self) -> int:
        return 0 if self.dv is None else self.dv.cardinality

    def bounds(self, column: str) -> tuple[Any, Any]:
        """(min, max) of a column from the statistics, None where unknown."""
        stats = self.parsed_stats()
        return (stats.get("minValues") or {}).get(column), (stats.get("maxValues") or {}).get(column)

    def add_action(self, dv: Descriptor | None, data_change: bool = True) -> dict[str, Any]:
        """The ``add`` of this data file with the deletion vector ``dv``."""
        add: dict[str, Any] = {"path": self.path, "partitionValues": self.partition_values, "size": self.size,
                               "modificationTime": self.modification_time, "dataChange": data_change}
        if self.stats is not None:
            add["stats"] = self.stats
        if dv is not None:
            add["deletionVector"] = dv.to_json()
        add.update(self.extra)
        return {"add": add}

    def remove_action(self, now_ms: int, data_change: bool = True) -> dict[str, Any]:
        """The ``remove`` of this logical file (its current deletion vector named)."""
        remove: dict[str, Any] = {"path": self.path, "deletionTimestamp": now_ms, "dataChange": data_change,
                                  "extendedFileMetadata": True, "partitionValues": self.partition_values,
                                  "size": self.size}
        if self.stats is not None:
            remove["stats"] = self.stats
        if self.dv is not None:
            remove["deletionVector"] = self.dv.to_json()
        remove.update({k: v for k, v in self.extra.items() if k != "clusteringProvider"})
        return {"remove": remove}


def configuration(metadata: dict[str, Any] | None) -> dict[str, str]:
    """A ``metaData`` action's table properties as a dict (a checkpoint's map reads back as pairs)."""
    raw = (metadata or {}).get("configuration") or {}
    return dict(raw) if not isinstance(raw, dict) else raw


@dataclass
class DeltaState:
    """The table at ``version``: live files by path, and the txn version of every app id -- with the
    newest protocol, domain metadata and txn times, everything a checkpoint of the version holds besides
    the tombstones (:mod:`flinkish_spark.connectors.delta.checkpoint` reads those from the log)."""

    version: int
    files: dict[str, LiveFile]
    txns: dict[str, int]
    metadata: dict[str, Any] | None = None  # the newest metaData action (routing: the target's schema)
    protocol: dict[str, Any] | None = None  # the newest protocol action
    domains: dict[str, dict[str, Any]] = field(default_factory=dict)  # domainMetadata actions not removed
    txn_updated: dict[str, int | None] = field(default_factory=dict)  # lastUpdated of each app id's txn
    # The checkpoint the state was read from or the sink wrote last: (version, part URLs), (-1, ()) for none.
    checkpoint: tuple[int, tuple[str, ...]] = (-1, ())

    def txn(self, uid: str) -> int:
        return self.txns.get(uid, -1)

    def apply(self, version: int, actions: list[dict[str, Any]], validated: int = -1) -> None:
        """Reconcile one commit. Raises TableChanged at a metadata or protocol change after the
        version ``validated`` (the state is then left before that commit: the caller reloads
        it after re-validating the table)."""
        for action in actions:
            if ("metaData" in action or "protocol" in action) and version > validated:
                raise TableChanged(f"version {version} changed the table's "
                                   f"{'metadata' if 'metaData' in action else 'protocol'}")
        for action in actions:
            if "remove" in action:
                self.files.pop(str(action["remove"]["path"]), None)
        for action in actions:
            if "add" in action:
                f = LiveFile.from_add(action["add"])
                self.files[f.path] = f
            elif "metaData" in action:
                self.metadata = dict(action["metaData"])
            elif "protocol" in action:
                self.protocol = dict(action["protocol"])
            elif "domainMetadata" in action:
                self._domain(action["domainMetadata"])
            elif "txn" in action:
                self._txn(action["txn"])
        self.version = version

    def _txn(self, txn: dict[str, Any]) -> None:
        app = str(txn["appId"])
        if int(txn["version"]) >= self.txns.get(app, -1):
            self.txns[app] = int(txn["version"])
            self.txn_updated[app] = None if txn.get("lastUpdated") is None else int(txn["lastUpdated"])

    def _domain(self, domain: dict[str, Any]) -> None:
        if domain.get("removed"):
            self.domains.pop(str(domain["domain"]), None)
        else:
            self.domains[str(domain["domain"])] = dict(domain)

    def catch_up(self, log: DeltaLog, validated: int = -1) -> int:
        """Apply the commits after ``version`` (one GET each); the number applied."""
        applied = 0
        while True:
            actions = log.read(self.version + 1)
            if actions is None:
                return applied
            self.apply(self.version + 1, actions, validated)
            applied += 1


def load_state(log: DeltaLog, validated: int) -> DeltaState:
    """The newest state of the table: its newest checkpoint, then every commit after it.

    ``validated``: the version whose metadata and protocol the caller checked; a change
    of either after it raises TableChanged.
    """
    checkpoint, parts = _find_checkpoint(log)
    state = DeltaState(-1, {}, {})
    if checkpoint >= 0:
        for part in parts:
            for kind, row in _checkpoint_rows(log, part):
                if kind == "add":
                    f = LiveFile.from_add(row)
                    state.files[f.path] = f
                elif kind == "metaData":
                    state.metadata = row
                elif kind == "protocol":
                    state.protocol = row
                elif kind == "domainMetadata":
                    state._domain(row)
                else:
                    state._txn(row)
        state.version = checkpoint
        state.checkpoint = (checkpoint, tuple(parts))
    state.catch_up(log, validated)
    if state.version < 0:
        raise TableMismatchError(f"{log.root} holds no Delta commit")
    return state


def _find_checkpoint(log: DeltaLog) -> tuple[int, list[str]]:
    """The newest complete classic checkpoint: (version, part URLs); (-1, []) without one."""
    info = log.last_checkpoint_info()
    if info is not None:
        version, parts = int(info["version"]), int(info.get("parts") or 1)
        urls = _part_urls(log, version, parts)
        if all(log.io.exists(u) for u in urls):
            return version, urls
    # No (or a stale) _last_checkpoint: one listing of the log folder.
    found: dict[int, dict[int, set[int]]] = {}
    for name in log.io.list_names(log.root):
        m = _CHECKPOINT.match(name)
        if m:
            v, part, total = int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1)
            found.setdefault(v, {}).setdefault(total, set()).add(part)
    for v in sorted(found, reverse=True):
        for total, got in found[v].items():
            if got == set(range(1, total + 1)):
                return v, _part_urls(log, v, total)
    return -1, []


def _part_urls(log: DeltaLog, version: int, parts: int) -> list[str]:
    if parts == 1:
        return [f"{log.root}/{version:020d}.checkpoint.parquet"]
    return [f"{log.root}/{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)]


def _checkpoint_rows(log: DeltaLog, url: str) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        with log.io.fs.open(log.io.strip(url), "rb") as handle:
            pf = pq.ParquetFile(handle)
            names = pf.schema_arrow.names
            if "sidecar" in names and pf.read(columns=["sidecar"]).column("sidecar").null_count < pf.metadata.num_rows:
                raise TableMismatchError(f"{url} is a V2 checkpoint with sidecar files, which the flinkish.delta "
                                         "sink's keyed modes do not read yet")
            table = pf.read(columns=[c for c in ("add", "txn", "metaData", "protocol", "domainMetadata") if c in names])
    except (OSError, ValueError) as exc:
        raise CorruptMetadataError(f"the Delta checkpoint {url} could not be read: {exc}") from None
    for name in table.column_names:
        for row in table.column(name).to_pylist():
            if row is not None:
                yield name, row
