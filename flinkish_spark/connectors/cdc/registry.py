"""The tables a multi-table source follows: an immutable, versioned file per change of the set.

The enumerator's state (stored in every checkpoint) names one registry file; the file holds
every followed table (``tid``, oid, name, state). A new file is written only when a table
joins, finishes its snapshot, is renamed, dropped or snapshotted again -- so a checkpoint's size does not grow
with the number of tables, and an epoch in which no table joined or left writes none.

Files are ``<source dir>/tables/v<version>-<hash>.json``, written before the checkpoint that
names them (write-ahead, as checkpoints are); the hash makes a file a crashed run wrote and
never referenced a different name from its replacement. Retention keeps the versions a
retained checkpoint can name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from flinkish_spark.io.fileio import FileIO

#: joining: in the publication, waiting until every transaction that was open when it joined
#: has ended (then its chunks are planned); snapshot: chunks planned, not all read;
#: streaming: snapshot read, followed through the change stream only.
TableState = Literal["joining", "snapshot", "streaming"]
FOLDER = "tables"


@dataclass(frozen=True)
class TableEntry:
    tid: int  # never reused within the source: a table snapshotted again gets a new one
    oid: int
    schema: str
    table: str
    state: TableState
    after_xid: int | None = None  # joining: the next transaction id when it joined (see docs: New tables)
    # The primary key when the table was planned: the key of its changes under a replica identity other
    # than DEFAULT (pgoutput flags the identity's columns, not the key), fixed so that a replayed range
    # reads the same schema even after the table is gone. None: a registry file of an older version.
    key: tuple[str, ...] | None = None
    #: joining for a re-snapshot: a WAL position after the statement that caused it; its chunks are planned
    #: once no change before it is left unread, so that no change from before is applied after a chunk row
    after_lsn: int | None = None
    #: the catalog signature recorded when the entry was made, in the dialect's JSON form (opaque here;
    #: PostgreSQL: :meth:`..postgres.source.signature.Signature.to_json`); None in files written before
    #: signatures existed (recorded at the next poll)
    signature: Any = None
    reason: str | None = None  # a re-snapshot: why (for people reading the registry)

    @property
    def name(self) -> str:
        """``schema.table``, unquoted: the stream's ``_table``."""
        return f"{self.schema}.{self.table}"

    def with_state(self, state: TableState) -> "TableEntry":
        return replace(self, state=state)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"tid": self.tid, "oid": self.oid, "schema": self.schema, "table": self.table,
                                "state": self.state, "after_xid": self.after_xid,
                                "key": None if self.key is None else list(self.key)}
        if self.after_lsn is not None:
            d["after_lsn"] = self.after_lsn
        if self.signature is not None:
            d["signature"] = self.signature
        if self.reason is not None:
            d["reason"] = self.reason
        return d

    @classmethod
    def from_dict(cls, e: dict[str, Any]) -> "TableEntry":
        sig, key = e.get("signature"), e.get("key")
        return cls(int(e["tid"]), int(e["oid"]), str(e["schema"]), str(e["table"]), e["state"], e.get("after_xid"),
                   key=None if key is None else tuple(str(k) for k in key), after_lsn=e.get("after_lsn"),
                   signature=sig, reason=e.get("reason"))


@dataclass(frozen=True)
class Registry:
    version: int = 0
    next_tid: int = 0
    entries: tuple[TableEntry, ...] = field(default=())
    #: (name, WAL position after it ended) of entries that ended (dropped, renamed) while changes of theirs may
    #: still be unread: a table joining under such a name waits for them (``after_lsn``). Forgotten once the
    #: change split's committed position passes them.
    ended: tuple[tuple[str, int], ...] = field(default=())

    def to_json(self) -> bytes:
        body: dict[str, object] = {"version": self.version, "next_tid": self.next_tid,
                                   "tables": [e.to_dict() for e in self.entries]}
        if self.ended:
            body["ended"] = [list(x) for x in self.ended]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Registry":
        d = json.loads(data)
        entries = tuple(TableEntry.from_dict(e) for e in d["tables"])
        return cls(int(d["version"]), int(d["next_tid"]), entries,
                   tuple((str(n), int(lsn)) for n, lsn in d.get("ended", ())))

    @property
    def file_name(self) -> str:
        return f"v{self.version:08d}-{hashlib.sha256(self.to_json()).hexdigest()[:12]}.json"

    def by_oid(self) -> dict[int, TableEntry]:
        return {e.oid: e for e in self.entries}

    def by_tid(self) -> dict[int, TableEntry]:
        return {e.tid: e for e in self.entries}

    def with_entries(self, entries: list[TableEntry], next_tid: int | None = None,
                     ended: tuple[tuple[str, int], ...] | None = None) -> "Registry":
        return replace(self, version=self.version + 1, entries=tuple(sorted(entries, key=lambda e: e.tid)),
                       next_tid=self.next_tid if next_tid is None else next_tid,
                       ended=self.ended if ended is None else ended)


def write(io: FileIO, directory: str, registry: Registry) -> str:
    """Write ``registry`` (idempotent: the same content has the same name) and return its file name."""
    name = registry.file_name
    io.write_bytes(f"{directory}/{FOLDER}/{name}", registry.to_json())
    return name


def read(io: FileIO, directory: str, name: str) -> Registry:
    return Registry.from_json(io.read_bytes(f"{directory}/{FOLDER}/{name}"))


def retain(io: FileIO, directory: str, keep_from_version: int) -> None:
    """Delete registry files older than ``keep_from_version``."""
    folder = f"{directory}/{FOLDER}"
    doomed = [n for n in io.list_names(folder) if n.startswith("v") and int(n[1:9]) < keep_from_version]
    io.delete_many([f"{folder}/{n}" for n in doomed])


def of_state(io: FileIO, directory: str, enumerator_state: bytes) -> Registry | None:
    """The registry a checkpoint's enumerator state names (None: not a multi-table source, or not started)."""
    try:
        name = json.loads(enumerator_state or b"{}").get("registry")
    except ValueError:
        return None
    return None if not name else read(io, directory, name)


def planned_keys(io: FileIO, directory: str, enumerator_state: bytes) -> dict[int, tuple[str, ...]]:
    """oid -> key of every table an epoch's WAL range may carry, as recorded when they were planned: the
    entries of the registry at the start of the epoch's planning (``previous_registry``: it still holds
    a table whose entry the planning ended, e.g. dropped, whose last changes are in this range) and of
    the registry after it (tables that joined). The same for every read of the epoch."""
    state = json.loads(enumerator_state or b"{}")
    keys: dict[int, tuple[str, ...]] = {}
    for name in (state.get("previous_registry"), state.get("registry")):
        if name:
            keys.update({e.oid: e.key for e in read(io, directory, name).entries if e.key is not None})
    return keys
