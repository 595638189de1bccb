"""The finish controller's decision, on progress events as Spark posts them (no Spark needed)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from flinkish_spark.finish.controller import verdict
from flinkish_spark.finish.stop_request import mark_done, request_stop
from flinkish_spark.io.fileio import FileIO


def progress(*offsets: dict, state: bool = False, watermark: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        id="q", runId="r", sources=[SimpleNamespace(endOffset=json.dumps(o)) for o in offsets],
        stateOperators=[{"numRowsTotal": 1}] if state else [],
        eventTime={"watermark": watermark} if watermark else {},
    )


def off(uid: str, status: str, root: str, **extra) -> dict:
    return {"v": 1, "uid": uid, "ckpt": 3, "status": status, "root": root, **extra}


def test_ends_only_when_every_source_is_finished(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert verdict(progress(off("a", "FINISHED", root), off("b", "RUNNING", root))) is None
    assert verdict(progress(off("a", "FINISHED", root), off("b", "PARTIALLY_FINISHED", root))) is None
    v = verdict(progress(off("a", "FINISHED", root), off("b", "FINISHED", root)))
    assert v is not None and v.end == "finished"


def test_a_source_that_is_not_flinkish_keeps_the_query_running(tmp_path: Path) -> None:
    p = progress(off("a", "FINISHED", str(tmp_path)))
    p.sources.append(SimpleNamespace(endOffset='{"0": 1234}'))  # e.g. the rate source
    assert verdict(p) is None


def test_waits_for_the_end_of_input_marker_and_for_the_batch_that_fires_the_windows(tmp_path: Path) -> None:
    root = str(tmp_path)
    assert verdict(progress(off("a", "FINISHED", root, eoi="pending"))) is None
    emitted = off("a", "FINISHED", root, eoi="emitted")
    assert verdict(progress(emitted, state=True, watermark="1970-01-01T00:01:35.000Z")) is None
    assert verdict(progress(emitted, state=True, watermark="9999-12-30T23:59:55.000Z")) is not None
    assert verdict(progress(emitted, state=False)) is not None  # nothing stateful: nothing to fire


def test_a_stop_counts_only_for_the_live_run_it_was_meant_for(tmp_path: Path) -> None:
    root, io = str(tmp_path), FileIO.for_url(str(tmp_path))
    lease = tmp_path / "sources" / "a" / "_lease.json"
    lease.parent.mkdir(parents=True)
    lease.write_text(json.dumps({"run_id": "run-1", "renewed_ms": 0}))
    req = request_stop(io, root, "a", drain=False)
    stopped = progress(off("a", "RUNNING", root, stop=req.id))
    v = verdict(stopped)
    assert v is not None and v.end == "stopped" and v.request_id == req.id
    lease.write_text(json.dumps({"run_id": "run-2", "renewed_ms": 0}))  # a restart took over
    assert verdict(stopped) is None
    lease.write_text(json.dumps({"run_id": "run-1", "renewed_ms": 0}))
    mark_done(io, root, "a", req.id, "stopped")  # already carried out
    assert verdict(stopped) is None
