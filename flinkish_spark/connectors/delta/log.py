"""Writing a Delta table's log: blind appends at a cost that does not grow with the table, and single versions.

:meth:`DeltaLog.append` is the blind append of ``mode=append`` (below). The keyed commit
(:mod:`flinkish_spark.connectors.delta.keyed`) writes one version at a time with
:meth:`DeltaLog.write_version` (put-if-absent; :class:`VersionTaken` when another writer has
it) and :func:`commit_payload`, and on :class:`VersionTaken` reads the winner and computes
its version again: a read-modify-write conflicts with any concurrent commit.

Why not delta-rs's commit: delta-rs (1.x) holds every live file of the table in memory
and rebuilds that list after each commit -- inside ``create_write_transaction`` and
again in ``update_incremental`` -- so one commit costs O(live files): measured on local
disk, 5 ms with 10 files, 25 ms with 100, 155 ms with 500 (``without_files`` is
deprecated and ignored since delta-rs 1.0). A streaming append needs none of it.

What the Delta protocol asks of a *blind append* (a commit that read no data): write
the next version ``_delta_log/<version, 20 digits>.json`` with put-if-absent, so that of
two writers of one version exactly one wins; the loser reads the winning commit and
tries the next version. An append that read nothing conflicts only with a concurrent
change of the table's metadata or protocol, and -- for idempotence -- with a concurrent
transaction of the same ``appId`` (what Spark's and delta-rs's conflict checkers do).
:class:`DeltaLog` does exactly that:

* **O(1) per commit.** It keeps the newest version it has seen (:class:`LogHead`) and
  writes ``version + 1`` (one PUT); it reads ``_last_checkpoint`` and the commits other
  writers added since (one GET each). No listing, no file list.
* **Exactly once.** The commit carries ``txn(appId = uid, version = epoch)``. A commit
  of another writer that holds a txn of our uid with a version >= the epoch (our own
  earlier attempt whose answer was lost) makes :meth:`DeltaLog.append` answer
  ``ALREADY_COMMITTED``; a lost answer of the put itself is recognised by
  :meth:`FileIO.write_exclusive` (the stored bytes are ours).
* **Never on top of an unseen change.** A ``metaData`` or ``protocol`` action in a
  commit read forward raises :class:`TableChanged`: the caller re-reads and
  re-validates the table (delta-rs) before appending again.
* **Never into another table.** The head keeps a digest of the commit it stands on; a table
  folder deleted and created anew at the same path (a notebook) no longer has that commit
  (:meth:`DeltaLog.same_table`), and the caller reloads instead of appending after the old
  table's last version or taking the new table's epochs for committed ones.
* **Never into a cleaned-up past.** If ``_last_checkpoint`` is at or beyond the version
  about to be written, log cleanup may have removed that version, and a put-if-absent
  would then succeed *behind* the table: the version is read instead, and if it is gone,
  :class:`StaleHead` makes the caller reload the head.

Only tables whose protocol asks nothing of an appending writer take this path
(:func:`blind_append_supported`); other tables are committed through delta-rs.
Checkpoints are written by delta-rs (they list every live file: O(live files) by the
protocol), every ``checkpointInterval`` versions.
"""

from __future__ import annotations

import hashlib
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Literal

from flinkish_spark.connectors.delta.deletion_vectors import Descriptor
from flinkish_spark.errors import AlreadyExistsError
from flinkish_spark.io.fileio import FileIO

# Writer features that ask nothing of a writer that only adds new data files.
BLIND_APPEND_WRITER_FEATURES = frozenset({
    "appendOnly", "changeDataFeed", "deletionVectors", "domainMetadata", "timestampNtz", "vacuumProtocolCheck",
})
ENGINE_INFO = "flinkish_spark (blind append)"
KEYED_ENGINE_INFO = "flinkish_spark (keyed, deletion vectors)"


class TableChanged(Exception):
    """Another writer changed the table's metadata or protocol since the head was read."""


class StaleHead(Exception):
    """The head is older than the log's newest checkpoint: reload it."""


@dataclass
class LogHead:
    """What a writer of ``uid`` knows of the log: the newest version seen, ``uid``'s txn there,
    and a digest of that version's commit file (None until read) that tells the table apart."""

    version: int
    txn: int
    digest: str | None = None


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blind_append_supported(protocol: Any, schema: Any) -> bool:
    """Whether a table with this protocol (delta-rs ``ProtocolVersions``) and schema takes blind appends.

    Writer version 2 adds column invariants (checked by the writer): such a schema, and
    every writer feature beyond :data:`BLIND_APPEND_WRITER_FEATURES` (check constraints,
    generated or identity columns, column mapping, row tracking, in-commit timestamps,
    ...), goes through delta-rs instead.
    """
    version = int(protocol.min_writer_version)
    if version <= 2:
        return not any("delta.invariants" in (f.metadata or {}) for f in schema.fields)
    if version == 7:
        return set(protocol.writer_features or ()) <= BLIND_APPEND_WRITER_FEATURES
    return False


def quote_path(path: str) -> str:
    """A data file's path as the log names it: percent-encoded as a URI (relative to the table root)."""
    return urllib.parse.quote(path, safe="/=")


def add_action(path: str, size: int, partition_values: dict[str, str | None], stats: str, now_ms: int,
               data_change: bool = True) -> dict[str, Any]:
    """A Delta ``add`` action of a new data file."""
    return {"add": {"path": quote_path(path), "partitionValues": partition_values, "size": size,
                    "modificationTime": now_ms, "dataChange": data_change, "stats": stats}}


class DeltaLog:
    """The ``_delta_log`` folder of one table, for blind appends."""

    def __init__(self, io: FileIO, table_path: str) -> None:
        self.io = io
        self.root = f"{table_path.rstrip('/')}/_delta_log"

    def commit_url(self, version: int) -> str:
        return f"{self.root}/{version:020d}.json"

    def read(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of one commit, None when there is no such version (yet)."""
        data = self._read_bytes(version)
        return None if data is None else _actions(data)

    def _read_bytes(self, version: int) -> bytes | None:
        try:
            return self.io.read_bytes(self.commit_url(version))
        except FileNotFoundError:
            return None

    def digest(self, version: int) -> str | None:
        """The digest of one commit file (None: no such version): what tells two tables apart."""
        data = self._read_bytes(version)
        return None if data is None else _digest(data)

    def same_table(self, head: LogHead) -> bool:
        """Whether the log still holds the commit ``head`` stands on, byte for byte (one GET).

        False for a table deleted and created again at the path (its versions are other
        commits, or fewer). A head without a digest learns it here.
        """
        digest = self.digest(head.version)
        if head.digest is None:
            head.digest = digest
            return True
        return digest is not None and digest == head.digest

    def last_checkpoint(self) -> int:
        """The version ``_last_checkpoint`` names, -1 without one."""
        info = self.last_checkpoint_info()
        return -1 if info is None else int(info["version"])

    def catch_up(self, head: LogHead, uid: str) -> None:
        """Read the commits after ``head`` (advancing it) up to the newest: one GET each, plus one.

        Raises TableChanged at a metadata or protocol change (the head then stands
        before that commit, so the caller re-validates). A head behind cleaned-up
        commits stays where it is; :meth:`append` finds that out before writing.
        """
        while True:
            data = self._read_bytes(head.version + 1)
            if data is None:
                return
            _apply(head, uid, head.version + 1, _actions(data), data)

    def last_checkpoint_info(self) -> dict[str, Any] | None:
        """``_last_checkpoint`` as written (``version``, optional ``parts``), None without one -- or with one a
        crash left torn (a hint: delta-rs and Spark list the log then, as :func:`~.state.load_state` does)."""
        try:
            info = dict(json.loads(self.io.read_bytes(f"{self.root}/_last_checkpoint")))
            int(info["version"])
            return info
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError):
            return None

    def append(self, head: LogHead, uid: str, epoch: int, actions: list[dict[str, Any]],
               info: dict[str, Any]) -> Literal["COMMITTED", "ALREADY_COMMITTED"]:
        """Commit ``actions`` with ``txn(uid, epoch)`` as the next version after ``head``.

        Advances ``head`` to the version written (or to the newest read). Raises
        TableChanged as :meth:`catch_up` does, and StaleHead when the version to write
        is behind the newest checkpoint and gone (log cleanup): the head must be reloaded.
        """
        checkpoint = self.last_checkpoint()
        while True:
            if head.txn >= epoch:
                return "ALREADY_COMMITTED"
            version = head.version + 1
            passed = self._passed_bytes(version, checkpoint)
            if passed is not None:
                _apply(head, uid, version, _actions(passed), passed)
                continue
            payload = commit_payload(uid, epoch, actions, info, read_version=head.version, blind=True)
            try:
                self.write_version(version, payload)
            except VersionTaken:
                # Another writer took this version: read it, then try the next one.
                winner = self._read_bytes(version)
                if winner is None:  # cleaned up already: we are far behind
                    raise StaleHead(f"{self.root}: version {version} exists but could not be read") from None
                _apply(head, uid, version, _actions(winner), winner)
                continue
            head.version, head.txn, head.digest = version, epoch, _digest(payload)
            return "COMMITTED"

    def behind_checkpoint(self, version: int, checkpoint: int) -> list[dict[str, Any]] | None:
        """The actions of ``version`` when it is at or behind the newest checkpoint (so it must exist
        already), None when it is ahead (free to write). Raises StaleHead when it is gone.

        Why: log cleanup may have removed that version, and a put-if-absent would then succeed
        *behind* the table.
        """
        passed = self._passed_bytes(version, checkpoint)
        return None if passed is None else _actions(passed)

    def _passed_bytes(self, version: int, checkpoint: int) -> bytes | None:
        if checkpoint < version:
            return None
        passed = self._read_bytes(version)
        if passed is None:
            raise StaleHead(f"{self.root}: version {version} is behind checkpoint {checkpoint} and gone")
        return passed

    def write_version(self, version: int, payload: bytes, sync_folder: bool = True) -> None:
        """Put-if-absent of one commit file; VersionTaken when another writer has that version. ``sync_folder``
        False: on a local disk the caller makes the name durable (:mod:`flinkish_spark.io.local_disk`).

        A put whose answer was lost but that landed is recognised by FileIO.write_exclusive
        (the stored bytes are ours) and counts as written.
        """
        try:
            self.io.write_exclusive(self.commit_url(version), payload, sync_folder)
        except AlreadyExistsError:
            raise VersionTaken(version) from None

    def added_by(self, uid: str, epoch: int, newest: int, limit: int = 1000) -> set[str] | None:
        """The files (paths relative to the table, decoded: data files and deletion vector files)
        that the commit holding ``txn(uid, epoch)`` added -- and the compactions of the epoch
        after it (``flinkish.compaction``) -- searched back from version ``newest`` (one GET per
        version passed; the epoch's own commit is normally the newest or the one before).

        An empty set when the log shows that no commit holds the epoch (an older txn of
        ``uid`` comes first); None when it cannot tell (a version on the way is gone, or more
        than ``limit`` versions were read): then nothing of the epoch may be deleted.
        """
        found: set[str] = set()
        for version in range(newest, max(-1, newest - limit), -1):
            actions = self.read(version)
            if actions is None:
                return None
            info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
            if info.get("flinkish.uid") == uid and info.get("flinkish.compaction") == epoch:
                found |= stored_files(actions)
            for action in actions:
                txn = action.get("txn")
                if txn is None or txn.get("appId") != uid:
                    continue
                if int(txn["version"]) == epoch:
                    return found | stored_files(actions)
                if int(txn["version"]) < epoch:
                    return set()
        return set() if newest - limit < 0 else None


class VersionTaken(Exception):
    """Another writer committed the version this writer tried to write."""

    def __init__(self, version: int) -> None:
        super().__init__(f"version {version} is taken")
        self.version = version


def commit_payload(uid: str, epoch: int | None, actions: list[dict[str, Any]], info: dict[str, Any],
                   read_version: int | None, blind: bool, operation: str = "STREAMING UPDATE",
                   output_mode: str = "Append") -> bytes:
    """The bytes of one commit: commitInfo, ``txn(uid, epoch)`` (none for epoch None), then ``actions``.

    ``read_version`` None: no ``readVersion`` (version 0 read nothing; delta-rs's history() refuses -1)."""
    now = int(time.time() * 1000)
    parameters = {"outputMode": output_mode, "queryId": uid, "epochId": str(epoch)} if epoch is not None else {}
    commit_info = {"timestamp": now, "operation": operation, "operationParameters": parameters,
                   **({} if read_version is None else {"readVersion": read_version}),
                   "isolationLevel": "Serializable", "isBlindAppend": blind,
                   "engineInfo": ENGINE_INFO if blind else KEYED_ENGINE_INFO, **info}
    txn = [{"txn": {"appId": uid, "version": epoch, "lastUpdated": now}}] if epoch is not None else []
    lines = [{"commitInfo": commit_info}, *txn, *actions]
    return "\n".join(json.dumps(line, separators=(",", ":")) for line in lines).encode() + b"\n"


def stored_files(actions: list[dict[str, Any]]) -> set[str]:
    """The files the ``add`` actions of one commit name (relative to the table, decoded): data
    files, and the deletion vector files below the table (``u``) their vectors are stored in."""
    out: set[str] = set()
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        out.add(urllib.parse.unquote(add["path"]))
        dv = add.get("deletionVector")
        dv_file = Descriptor.from_json(dv).stored_file() if dv else None
        if dv_file:
            out.add(dv_file)
    return out


def _actions(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _apply(head: LogHead, uid: str, version: int, actions: list[dict[str, Any]], data: bytes) -> None:
    for action in actions:
        if "metaData" in action or "protocol" in action:
            raise TableChanged(f"version {version} changed the table's {'metadata' if 'metaData' in action else 'protocol'}")
        txn = action.get("txn")
        if txn is not None and txn.get("appId") == uid:
            head.txn = max(head.txn, int(txn["version"]))
    head.version, head.digest = version, _digest(data)
