"""The progress view's figures from Spark progress events (fast: no Spark; the checkpoint part runs in test_pipeline)."""

from __future__ import annotations

import io
import time
from types import SimpleNamespace
from typing import Any

import pytest

from flinkish_spark.mirror.config import from_args
from flinkish_spark.mirror.progress import OBSERVED, LiveProgress, MirrorState, Progress, TableProgress

CONFIG = from_args(source="postgresql://u@h/db", tables="public.*", to="/lake", fmt=None, checkpoint="/meta")


def event(batch: int, rows: int, changes: int, last_commit_s: float | None) -> Any:
    metrics = {"rows": rows, "snapshot_rows": rows - changes, "changes": changes,
               "last_commit_us": None if last_commit_s is None else int(last_commit_s * 1e6)}
    return SimpleNamespace(batchId=batch, observedMetrics={OBSERVED: metrics}, sources=[])


def query(*events: Any) -> Any:
    return SimpleNamespace(recentProgress=list(events))


def test_rows_changes_and_lag_add_up_over_batches_each_counted_once() -> None:
    state = MirrorState()
    now = time.time()
    assert state.update(query(event(0, 100, 0, None), event(1, 50, 20, now - 30)))
    assert not state.update(query(event(0, 100, 0, None), event(1, 50, 20, now - 30)))  # seen: not again
    assert state.update(query(event(1, 50, 20, now - 30), event(2, 10, 10, now - 5), event(3, 0, 0, None)))
    assert (state.epoch, state.rows, state.changes) == (3, 160, 30)
    lag = state.lag_s(now)
    assert lag is not None and lag == pytest.approx(5, abs=0.01)  # the newest change's age, an empty batch keeps it


def test_plain_lines_and_the_live_table(capsys: pytest.CaptureFixture[str]) -> None:
    plain = Progress(CONFIG)
    plain.state.tables = {"public.a": TableProgress("streaming", {"snapshot-0-t0-00000"}),
                          "public.b": TableProgress("snapshot", {"snapshot-0-t1-00000"}, 2),
                          "public.c": TableProgress("left")}
    plain.update(query(event(7, 16, 4, time.time() - 2)))
    line = capsys.readouterr().out.strip()
    assert line.startswith("epoch 7: tables snapshotted 1/2, rows 16 (changes 4), lag 2.")
    out = io.StringIO()
    from rich.console import Console

    live = LiveProgress(CONFIG, Console(file=out, force_terminal=True, width=120))
    live.state.tables = dict(plain.state.tables)
    live.update(query(event(7, 16, 4, None)))
    live.close()
    text = out.getvalue()
    assert "public.b" in text and "1/3" in text and "tables snapshotted 1/2" in text
