"""Stop requests: how ``flinkish_spark.stop`` and ``flinkish stop`` reach a running source.

A request is a small JSON object next to the source's checkpoints::

    <root>/sources/<uid>/_stop.json   {"id", "drain", "run_id", "created_ms", "state"}

It names the *run* it is meant for (the ``run_id`` of the source's lease when the
request was made), so a request left behind by a run that was killed is ignored by
the next run: a restart always runs. The source reads it in ``latestOffset`` -- at an
epoch boundary, never in the middle of a batch -- and the driver-side controller
marks it ``done`` once the query has ended.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, replace
from typing import Literal

from flinkish_spark.checkpoint.layout import join, source_dir
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO

RequestState = Literal["requested", "done"]
STOP_FILE = "_stop.json"
LEASE_FILE = "_lease.json"


@dataclass(frozen=True)
class StopRequest:
    id: str
    drain: bool
    run_id: str
    created_ms: int
    state: RequestState = "requested"
    outcome: str | None = None


def lease_run_id(io: FileIO, root: str, uid: str) -> str | None:
    try:
        return str(json.loads(io.read_bytes(join(source_dir(root, uid), LEASE_FILE)))["run_id"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def release_lease(io: FileIO, root: str, uid: str, run_id: str) -> None:
    """Delete source ``uid``'s lease if ``run_id`` still holds it (its run has ended)."""
    if lease_run_id(io, root, uid) == run_id:
        io.delete(join(source_dir(root, uid), LEASE_FILE))


def read_request(io: FileIO, root: str, uid: str) -> StopRequest | None:
    try:
        d = json.loads(io.read_bytes(join(source_dir(root, uid), STOP_FILE)))
        return StopRequest(**d)
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        # A damaged request is no request: a stop must never break a running query.
        return None


def request_stop(io: FileIO, root: str, uid: str, drain: bool, request_id: str | None = None) -> StopRequest:
    """Ask the live run of source ``uid`` to stop (or drain) at its next epoch boundary."""
    run_id = lease_run_id(io, root, uid)
    if run_id is None:
        raise ConfigError(
            f"source uid {uid!r} under {root} has no running query (no lease file): nothing to stop"
        )
    req = StopRequest(request_id or uuid.uuid4().hex[:12], drain, run_id, int(time.time() * 1000))
    io.write_bytes(join(source_dir(root, uid), STOP_FILE), json.dumps(asdict(req)).encode())
    return req


def mark_done(io: FileIO, root: str, uid: str, request_id: str, outcome: str) -> None:
    req = read_request(io, root, uid)
    if req is None or req.id != request_id:
        return
    done = replace(req, state="done", outcome=outcome)
    io.write_bytes(join(source_dir(root, uid), STOP_FILE), json.dumps(asdict(done)).encode())
