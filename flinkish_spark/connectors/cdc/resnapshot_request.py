"""Re-snapshot requests: how ``flinkish mirror resnapshot`` and ``flinkish_spark.resnapshot`` reach a
multi-table ``flinkish.postgres`` source, taken exactly once across kills.

A request is a write-once JSON object in the source's folder, created with put-if-absent and
never changed::

    <root>/sources/<uid>/resnapshot/<created_ms, 13 digits>-<id>.json   {"id", "tables", "created_ms", "reason"}

The running source (or the next run of a stopped one) takes it when it plans an epoch; the
target keeps its rows until the epoch that ends the re-snapshot (docs/mirror.md, "Re-snapshot a
table on demand").

Exactly once -- the argument the enumerator relies on:

* When it plans epoch N, the enumerator takes the requests whose ids are not in its *handled*
  set (:func:`take`), re-snapshots their tables and adds their ids to the set. The set is part
  of the enumerator's state (:func:`state_entry`), so checkpoint N -- written before Spark logs
  offset N -- records "taken" together with the chunks the taking planned.
* A crash before Spark logs offset N: the restart plans from checkpoint N-1, whose set lacks the
  id, and the file is still there: the request is taken again. The first taking left nothing
  anyone reads (checkpoint N and its registry version are orphans no offset names).
* A crash after: every restart continues from N or later, whose set has the id: never taken again.
* Once epoch N is committed (checkpoint complete), the files of the ids N's own state names are
  deleted (:func:`delete_handled`): no restart goes back before N any more. An id leaves the set
  in the first planning that no longer finds its file (:func:`forget`), so the set holds only
  requests in flight and a checkpoint does not grow with the requests ever made.

A request file deleted by hand before it was taken is a request withdrawn.
"""

from __future__ import annotations

import difflib
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

from flinkish_spark.checkpoint.layout import join, source_dir
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO

if TYPE_CHECKING:
    from flinkish_spark.checkpoint.model import SourceCheckpoint
    from flinkish_spark.connectors.cdc.registry import Registry

FOLDER = "resnapshot"
#: The key of the handled ids in the multi-table enumerator's state (``flinkish.enumerator_state``).
STATE_KEY = "resnapshot_requests"
_NAME = re.compile(r"^(\d{13})-([0-9a-f]{12})\.json$")
KIND = "flinkish.postgres"


@dataclass(frozen=True)
class Request:
    id: str  # 12 hex digits
    tables: tuple[str, ...]  # schema.table, unquoted, as the source's registry spells them
    created_ms: int
    reason: str

    @property
    def file_name(self) -> str:
        return f"{self.created_ms:013d}-{self.id}.json"

    def to_json(self) -> bytes:
        return json.dumps({"id": self.id, "tables": list(self.tables), "created_ms": self.created_ms,
                           "reason": self.reason}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Request":
        d = json.loads(data)
        return cls(str(d["id"]), tuple(str(t) for t in d["tables"]), int(d["created_ms"]), str(d.get("reason", "")))


# ------------------------------------------------------------------ the source's side


def folder(directory: str) -> str:
    """The requests' folder of the source whose folder is ``directory`` (``<root>/sources/<uid>``)."""
    return join(directory, FOLDER)


def _ids_present(io: FileIO, directory: str) -> dict[str, str]:
    """Request id -> file name, for every request file there (other names, e.g. temporary files, are ignored)."""
    out: dict[str, str] = {}
    for name in io.list_names(folder(directory)):
        m = _NAME.match(name)
        if m:
            out[m.group(2)] = name
    return out


def _read(io: FileIO, directory: str, name: str) -> Request | None:
    try:
        return Request.from_json(io.read_bytes(join(folder(directory), name)))
    except FileNotFoundError:
        return None  # deleted since the listing: withdrawn, or completed by another notification
    except (ValueError, KeyError, TypeError):
        # A damaged request is no request: it must never stop a running source. (Requests are
        # written whole with put-if-absent, so only a hand-edited file can be damaged.)
        return None


def pending(io: FileIO, directory: str, handled: Iterable[str]) -> list[Request]:
    """The requests in the folder not in ``handled``, oldest first."""
    done = set(handled)
    present = _ids_present(io, directory)
    out = [_read(io, directory, name) for rid, name in sorted(present.items(), key=lambda p: p[1]) if rid not in done]
    return [r for r in out if r is not None]


def forget(handled: Iterable[str], present: Iterable[str]) -> frozenset[str]:
    """``handled`` without the ids whose file is gone: their epoch was committed (or they were withdrawn),
    so no restart can find them again."""
    return frozenset(handled) & frozenset(present)


@dataclass(frozen=True)
class Taken:
    requests: tuple[Request, ...]  # to carry out in the epoch being planned, oldest first
    handled: frozenset[str]  # the enumerator's new handled set: these added, the forgotten ones dropped


def take(io: FileIO, directory: str, handled: Iterable[str]) -> Taken:
    """What the enumerator does when it plans an epoch (one listing of the folder)."""
    present = _ids_present(io, directory)
    kept = forget(handled, present)
    new = [_read(io, directory, name) for rid, name in sorted(present.items(), key=lambda p: p[1]) if rid not in kept]
    requests = tuple(r for r in new if r is not None)
    return Taken(requests, kept | {r.id for r in requests})


def state_entry(handled: Iterable[str]) -> dict[str, list[str]]:
    """The enumerator state's entry for ``handled`` (nothing while it is empty: the state of a source
    without requests is as before)."""
    ids = sorted(handled)
    return {STATE_KEY: ids} if ids else {}


def handled_of_state(state: bytes) -> frozenset[str]:
    """The handled ids an enumerator state (a checkpoint's ``enumerator_state``) records."""
    try:
        d = json.loads(state or b"{}")
    except ValueError:
        return frozenset()
    return frozenset(str(i) for i in d.get(STATE_KEY, ())) if isinstance(d, dict) else frozenset()


def delete_handled(io: FileIO, directory: str, checkpoint: "SourceCheckpoint") -> None:
    """``checkpoint``'s epoch is committed: delete the requests its state records as taken (idempotent)."""
    handled = handled_of_state(checkpoint.enumerator_state)
    if handled:
        present = _ids_present(io, directory)
        io.delete_many([join(folder(directory), present[i]) for i in sorted(handled) if i in present])


def oids(requests: Iterable[Request], registry: "Registry") -> list[int]:
    """The oids of the followed tables the requests name (a table that left since is skipped)."""
    names = {t for r in requests for t in r.tables}
    return sorted({e.oid for e in registry.entries if e.name in names})


def reason(requests: Iterable[Request]) -> str:
    """One line for the log and the re-snapshot's record: which requests asked for it."""
    return "; ".join(f"request {r.id} ({r.reason})" for r in requests)


# ------------------------------------------------------------------ the caller's side


def write_request(io: FileIO, directory: str, tables: Iterable[str], reason: str,
                  request_id: str | None = None, now_ms: int | None = None) -> Request:
    """Record a request for the source whose folder is ``directory`` (put-if-absent: never overwrites one)."""
    req = Request(request_id or uuid.uuid4().hex[:12], tuple(sorted(set(tables))),
                  int(time.time() * 1000) if now_ms is None else now_ms, reason)
    io.write_exclusive(join(folder(directory), req.file_name), req.to_json())
    return req


@dataclass(frozen=True)
class Requested:
    """What :func:`request_resnapshot` recorded, for the command's message."""

    uid: str
    request: Request
    running: bool  # the source's lease is live: its next epoch takes the request


def request_resnapshot(io: FileIO, root: str, tables: Iterable[str], uid: str | None = None,
                       reason: str = "flinkish_spark.resnapshot") -> Requested:
    """Check everything, then record a request (nothing is written when a check fails)."""
    from flinkish_spark.inspect import running_source_uids

    root = root.rstrip("/")
    wanted = [t.strip() for arg in tables for t in arg.split(",") if t.strip()]
    if not wanted:
        raise ConfigError("resnapshot: no table named; give schema.table names or patterns, e.g. public.orders")
    uid, latest = _source(io, root, uid)
    from flinkish_spark.connectors.cdc import registry

    directory = source_dir(root, uid)
    state = json.loads(latest.enumerator_state or b"{}")
    if "registry" not in state:
        raise ConfigError(
            f"resnapshot: source uid {uid!r} under {root} follows one table (option 'table'); a re-snapshot "
            "request needs the multi-table source (option 'tables', as flinkish mirror runs it). To read one "
            "table again, start its query with a new uid (a new snapshot into an empty target)")
    if json.loads(latest.config or "{}").get("startup") == "snapshot":
        raise ConfigError(
            f"resnapshot: source uid {uid!r} under {root} copies a snapshot only (startup=snapshot, "
            "--stop-after-snapshot) and follows no changes: run the copy again instead")
    if latest.finished:
        raise ConfigError(
            f"resnapshot: source uid {uid!r} under {root} is FINISHED (drained or stopped for good): it never "
            "plans another epoch, so nothing would take the request. Start a new mirror (a new uid)")
    followed = registry.of_state(io, directory, latest.enumerator_state)
    names = sorted({e.name for e in (followed.entries if followed is not None else ())})
    req = write_request(io, directory, _match(wanted, names, uid), reason)
    return Requested(uid, req, uid in running_source_uids(io, root))


def _source(io: FileIO, root: str, uid: str | None) -> tuple[str, "SourceCheckpoint"]:
    """The uid of the ``flinkish.postgres`` source the request is for, and its newest checkpoint."""
    from flinkish_spark.checkpoint.store import SourceCheckpointStore
    from flinkish_spark.inspect import running_source_uids, source_uids

    uids = source_uids(io, root)
    if not uids:
        raise ConfigError(
            f"resnapshot: no flinkish checkpoint at {root} (no sources/ folder there): pass the mirror's "
            "--checkpoint (the metadata root, the source's 'checkpoint' option)")
    if uid is not None and uid not in uids:
        close = difflib.get_close_matches(uid, uids, n=1)
        did = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"resnapshot: no source uid {uid!r} under {root}.{did} Sources there: {', '.join(uids)}")
    latest = {u: SourceCheckpointStore(io, root, u, kind="").latest() for u in ([uid] if uid else uids)}
    postgres = {u: c for u, c in latest.items() if c is not None and c.kind == KIND}
    if uid is not None:
        ckpt = latest[uid]
        if ckpt is None:
            raise ConfigError(
                f"resnapshot: source uid {uid!r} under {root} has not planned its first epoch yet; its first "
                "snapshot reads every table anyway")
        if ckpt.kind != KIND:
            raise ConfigError(f"resnapshot: source uid {uid!r} under {root} is a {ckpt.kind} source; "
                              f"only {KIND} with 'tables' re-snapshots a table")
        return uid, ckpt
    if not postgres:
        raise ConfigError(f"resnapshot: no {KIND} source with a checkpoint under {root} "
                          f"(sources there: {', '.join(uids)})")
    running = [u for u in running_source_uids(io, root) if u in postgres]
    candidates = running or sorted(postgres)
    if len(candidates) > 1:
        raise ConfigError(f"resnapshot: {len(candidates)} {KIND} sources under {root} "
                          f"({', '.join(candidates)}): name one with --uid (uid=)")
    return candidates[0], postgres[candidates[0]]


def _match(wanted: list[str], names: list[str], uid: str) -> list[str]:
    """The followed tables ``wanted`` (names and patterns) names; an error for an entry that names none."""
    from flinkish_spark.connectors.cdc.patterns import TablePatterns

    out: set[str] = set()
    for entry in wanted:
        if entry.startswith("!"):
            raise ConfigError(f"resnapshot: {entry!r}: exclusions are not taken here; name the tables to read again")
        pattern = TablePatterns.parse(entry, f"resnapshot: table {entry!r}")
        found = [n for n in names if pattern.matches(n)]
        if not found:
            close = [] if any(c in entry for c in "*?") else difflib.get_close_matches(entry.lower().replace('"', ""), names, n=1)
            did = f" Did you mean {close[0]!r}?" if close else ""
            shown = ", ".join(names[:10]) + (f", ... ({len(names)} in all)" if len(names) > 10 else "")
            raise ConfigError(f"resnapshot: source uid {uid!r} follows no table {entry!r}.{did} "
                              f"It follows: {shown or 'none yet'}")
        out.update(found)
    return sorted(out)


def resnapshot(checkpoint: str, tables: str | Iterable[str], uid: str | None = None,
               storage_options: Mapping[str, object] | None = None) -> str:
    """Ask the multi-table ``flinkish.postgres`` source under ``checkpoint`` to read ``tables`` again.

    ``tables``: ``schema.table`` names or patterns (``public.*``), a list or one comma-separated
    string, each naming at least one table the source follows. ``uid``: the source (default: the
    one ``flinkish.postgres`` source under ``checkpoint``, or the one running). ``storage_options``:
    fsspec options for the checkpoint's storage (default: from the environment, e.g.
    ``AWS_ENDPOINT_URL``). Returns the request's id.

    Every check runs before anything is written (a :class:`ConfigError` names what is wrong). The
    request is taken exactly once, by the source's next epoch -- now if it runs, else when it runs
    again: the target keeps its rows until the epoch that ends the re-snapshot.
    """
    from flinkish_spark.io.fileio import storage_options_from

    options = dict(storage_options) if storage_options is not None else storage_options_from({}, checkpoint)
    io = FileIO.for_url(checkpoint, options, what="checkpoint")
    names = [tables] if isinstance(tables, str) else list(tables)
    return request_resnapshot(io, checkpoint, names, uid).request.id
