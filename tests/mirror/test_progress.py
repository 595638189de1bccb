"""The progress view's figures from Spark progress events, the query's status and the source's metadata (fast: no
Spark; the metadata is written here as the source and Spark write it)."""

from __future__ import annotations

import io as io_module
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc.splits import table_chunk_id
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.spark_log import write_batch

from flinkish_spark.mirror.config import from_args
from flinkish_spark.mirror.progress import OBSERVED, LiveProgress, Metadata, MirrorState, Progress, TableProgress

CONFIG = from_args(source="postgresql://u@h/db", tables="public.*", to="/lake", fmt=None, checkpoint="/meta")
NO_METADATA = SimpleNamespace(read=lambda: (None, None, None))


def event(batch: int, rows: int, changes: int, last_commit_s: float | None, took_ms: int | None = None) -> Any:
    metrics = {"rows": rows, "snapshot_rows": rows - changes, "changes": changes,
               "last_commit_us": None if last_commit_s is None else int(last_commit_s * 1e6)}
    return SimpleNamespace(batchId=batch, observedMetrics={OBSERVED: metrics}, sources=[],
                           durationMs={"triggerExecution": took_ms} if took_ms else {})


def query(*events: Any, idle: bool = False) -> Any:
    return SimpleNamespace(recentProgress=list(events),
                           status={"message": "", "isDataAvailable": not idle, "isTriggerActive": False})


def test_rows_changes_and_lag_add_up_over_batches_each_counted_once() -> None:
    state = MirrorState()
    now = time.time()
    assert state.update(query(event(0, 100, 0, None), event(1, 50, 20, now - 30)))
    assert not state.update(query(event(0, 100, 0, None), event(1, 50, 20, now - 30)))  # seen: not again
    assert state.update(query(event(1, 50, 20, now - 30), event(2, 10, 10, now - 5), event(3, 0, 0, None)))
    assert (state.epoch, state.rows, state.changes) == (3, 160, 30)
    lag = state.lag_s(now)
    assert lag is not None and lag == pytest.approx(5, abs=0.01)  # the newest change's age, an empty batch keeps it


class Driver:
    """A query whose ``recentProgress`` costs (two py4j calls per event kept): counted; ``lastProgress`` is cheap."""

    def __init__(self) -> None:
        self.events: list[Any] = []
        self.full_reads = 0
        self.status = {"message": "", "isDataAvailable": True, "isTriggerActive": False}

    @property
    def recentProgress(self) -> list[Any]:
        self.full_reads += 1
        return list(self.events)

    @property
    def lastProgress(self) -> Any:
        return self.events[-1] if self.events else None


def test_each_batch_counted_once_reading_all_of_sparks_events_only_when_more_than_one_is_new() -> None:
    """The pipeline's main loop looks twice a second (and acts on Ctrl-C in between): all the events Spark keeps
    took it up to a second on a loaded driver. The newest event tells what is new; a look after a gap reads all."""
    state, driver = MirrorState(), Driver()
    driver.events = [event(0, 100, 0, None)]
    assert state.update(driver) and driver.full_reads == 1  # the first look: everything
    idle = SimpleNamespace(batchId=1, observedMetrics={}, sources=[], durationMs={})  # an idle trigger names batch 1
    idle_after_3 = SimpleNamespace(batchId=4, observedMetrics={}, sources=[], durationMs={})
    for events in ([idle], [], [event(1, 50, 20, None)], [], [event(2, 5, 5, None), event(3, 7, 7, None)],
                   [idle_after_3], []):
        driver.events += events
        state.update(driver)
    assert (state.epoch, state.rows, state.changes) == (3, 162, 32)
    assert driver.full_reads == 2  # the first look and the one after two new batches


def test_a_spark_connect_clients_metrics_are_counted_too() -> None:
    # A Connect client's progress events carry each observed metric as Row(values=[...], schema={...}) (pyspark
    # 4.x parses the event's JSON so), not as a Row of named fields.
    from pyspark.sql import Row

    names = ["rows", "snapshot_rows", "changes", "last_commit_us"]
    schema = {"type": "struct", "fields": [{"name": n, "type": "long", "nullable": True, "metadata": {}} for n in names]}
    connect = SimpleNamespace(batchId=0, sources=[], durationMs={"triggerExecution": 2000},
                              observedMetrics={OBSERVED: Row(values=[40, 30, 10, 1_700_000_000_000_000], schema=schema)})
    state = MirrorState()
    assert state.update(query(connect))
    assert (state.rows, state.changes, state.rate, state.last_commit_us) == (40, 10, 20.0, 1_700_000_000_000_000)


def test_plain_lines_and_the_live_table(capsys: pytest.CaptureFixture[str]) -> None:
    plain = Progress(CONFIG, NO_METADATA)
    plain.state.tables = {"public.a": TableProgress("streaming", 1),
                          "public.b": TableProgress("snapshot", 1, 0, 2),
                          "public.c": TableProgress("left")}
    plain.update(query(event(7, 16, 4, time.time() - 2, took_ms=500)))
    line = capsys.readouterr().out.strip()
    assert line.startswith("epoch 7: tables snapshotted 1/2, rows 16 (changes 4), 32 rows/s, lag 2."), line
    assert ", elapsed " in line
    out = io_module.StringIO()

    live = LiveProgress(CONFIG, Console(file=out, force_terminal=True, width=160), NO_METADATA)
    live.state.tables = dict(plain.state.tables)
    live.update(query(event(7, 16, 4, None)))
    live.close()
    text = out.getvalue()
    assert "public.b" in text and "1/3" in text and "tables snapshotted 1/2" in text


def test_the_running_epoch_its_chunks_per_table_and_caught_up_from_the_metadata(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Epoch 0 read a's first chunk and is committed; epoch 1 (planned: its checkpoint is written) reads a's second
    chunk now; a's third is planned; b streams. Then epochs 1 and 2 commit, a streams too, the source is idle."""
    config = from_args(source="postgresql://u@h/db", tables="public.*", to=str(tmp_path / "lake"), fmt=None,
                       checkpoint=str(tmp_path / "meta"))
    io = FileIO.for_url(config.checkpoint)
    store = SourceCheckpointStore(io, config.checkpoint, "mirror", "flinkish.postgres")
    reading = registry.Registry(1, 2, (registry.TableEntry(0, 100, "public", "a", "snapshot"),
                                       registry.TableEntry(1, 101, "public", "b", "streaming")))
    state = json.dumps({"registry": registry.write(io, store.directory, reading)}).encode()
    chunk = [table_chunk_id(0, 0, n) for n in range(3)]

    def checkpoint(ckpt: int, finished_in: list[int | None], enumerator: bytes = state) -> None:
        splits = tuple(SplitRecord(c, 0, 0 if f is None else 1, 1, f is not None, f) for c, f in zip(chunk, finished_in))
        store.write(SourceCheckpoint("mirror", "flinkish.postgres", ckpt, ckpt - 1 if ckpt else None,
                                     int(time.time() * 1000) - 3000, "{}", enumerator, False, splits))
        write_batch(config.spark_checkpoint, ckpt, [{"v": 1, "uid": "mirror", "ckpt": ckpt, "root": config.checkpoint}],
                    committed=False)

    checkpoint(0, [0, None, None])
    write_batch(config.spark_checkpoint, 0, [{"v": 1, "uid": "mirror", "ckpt": 0, "root": config.checkpoint}])
    checkpoint(1, [0, 1, None])  # planned: Spark runs it now
    out = io_module.StringIO()
    live = LiveProgress(config, Console(file=out, force_terminal=True, width=160))
    live.update(query(event(0, 100_000, 0, None, took_ms=2000)))  # only epoch 0 is committed
    a, b = live.state.tables["public.a"], live.state.tables["public.b"]
    assert (a.state, a.chunks, b.state, b.chunks) == ("snapshot", "1/3 +1", "streaming", "-")
    assert live.state.running is not None and live.state.running.ckpt == 1
    headline = live.headline()
    assert headline.startswith("mirror -- snapshot; epoch running for 3.") and "reading 1 chunks" in headline
    assert "50,000 rows/s" in headline and "elapsed" in headline
    live.close()
    assert "1/3 +1" in out.getvalue()

    done = registry.Registry(2, 2, tuple(e.with_state("streaming") for e in reading.entries))
    write_batch(config.spark_checkpoint, 1, [{"v": 1, "uid": "mirror", "ckpt": 1, "root": config.checkpoint}])
    checkpoint(2, [0, 1, 2], json.dumps({"registry": registry.write(io, store.directory, done)}).encode())
    write_batch(config.spark_checkpoint, 2, [{"v": 1, "uid": "mirror", "ckpt": 2, "root": config.checkpoint}])
    plain = Progress(config)
    plain.update(query(event(0, 100_000, 0, None), event(1, 100_000, 0, None), event(2, 5, 5, time.time() - 1),
                       idle=True))
    a = plain.state.tables["public.a"]
    assert (a.state, a.chunks, plain.state.running) == ("streaming", "3/3", None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("epoch 2: tables snapshotted 2/2, rows 200005 (changes 5)"), lines
    assert lines[1].startswith("caught up: every table streams and the source is idle"), lines
    plain.update(query(event(0, 100_000, 0, None), event(1, 100_000, 0, None), event(2, 5, 5, time.time() - 1)))
    assert plain.state.tables["public.a"].chunks == "3/3"
    later = SourceCheckpoint("mirror", "flinkish.postgres", 3, 2, int(time.time() * 1000), "{}",
                             json.dumps({"registry": done.file_name}).encode(), False, ())
    store.write(later)  # the snapshot's chunks are gone from the newest checkpoint: a's count stays
    write_batch(config.spark_checkpoint, 3, [{"v": 1, "uid": "mirror", "ckpt": 3, "root": config.checkpoint}])
    plain.update(query(event(3, 0, 0, None)))  # an epoch of the WAL's own progress: still caught up, said once
    assert plain.state.tables["public.a"].chunks == "3/3"
    assert plain.state.phase == "caught up" and capsys.readouterr().out.count("caught up") == 0
    plain.update(query(event(4, 7, 7, time.time())))  # the writer again
    assert plain.state.phase == "streaming"



def test_a_table_left_out_for_want_of_a_key_is_shown_with_its_warning_until_it_is_followed(
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the source records as not followed: a row 'not followed' in the live table, one warning line
    in the plain output (not repeated), not counted among the tables to snapshot; followed later: a table like any."""
    warning = "public.tmp is not followed: it has no primary key. ALTER TABLE public.tmp ADD PRIMARY KEY (...)"
    a = registry.TableEntry(0, 100, "public", "a", "streaming")

    def look(entries: tuple[registry.TableEntry, ...], not_followed: dict[str, str]) -> tuple[Any, None, Any, Any]:
        state = json.dumps({"registry": "x"}).encode()
        return (SourceCheckpoint("mirror", "flinkish.postgres", 1, None, 0, "{}", state, False, ()), None, entries,
                not_followed)

    found = [look((a,), {"public.tmp": warning})]
    plain = Progress(CONFIG, SimpleNamespace(read=lambda: found[0]))
    plain.update(query(event(0, 5, 0, None)))
    plain.update(query(event(0, 5, 0, None), event(1, 1, 1, time.time())))
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if "warning" in ln] == [f"flinkish mirror: warning: {warning}"]
    assert lines[0].startswith("epoch 0: tables snapshotted 1/1"), lines
    assert plain.state.tables["public.tmp"].state == "not followed"
    out = io_module.StringIO()
    live = LiveProgress(CONFIG, Console(file=out, force_terminal=True, width=200), SimpleNamespace(read=lambda: found[0]))
    live.update(query(event(0, 5, 0, None)))
    live.close()
    assert "public.tmp" in out.getvalue() and "not followed" in out.getvalue() and "no key" in out.getvalue()

    found[0] = look((a, registry.TableEntry(1, 101, "public", "tmp", "snapshot")), {})  # it got a key
    plain.update(query(event(2, 1, 1, time.time())))
    assert plain.state.tables["public.tmp"].state == "snapshot" and "tables snapshotted 1/2" in capsys.readouterr().out


def test_an_idle_triggers_event_does_not_hide_the_batch_that_runs_later_under_its_id() -> None:
    """Spark reports an idle trigger (no new data) as a progress event with the id of the batch that has not run yet
    and no observed metrics. That batch, when it runs, reports the same id: its rows and changes count (the mirror
    showed ``changes 0`` for a MySQL epoch of changes whose idle trigger came first)."""
    state = MirrorState()
    now = time.time()
    assert state.update(query(event(0, 2, 0, None)))
    idle = SimpleNamespace(batchId=1, observedMetrics={}, sources=[], durationMs={"triggerExecution": 3})
    assert not state.update(query(event(0, 2, 0, None), idle))  # nothing committed: no progress line
    assert state.epoch == 0
    assert state.update(query(event(0, 2, 0, None), idle, event(1, 3, 3, now - 1)))
    assert (state.epoch, state.rows, state.changes) == (1, 5, 3)


def test_a_restart_is_not_caught_up_before_its_first_trigger_looked_at_the_source() -> None:
    """Before the first trigger Spark's status says no data is available (``Initializing sources``): a restarted
    mirror whose tables all stream would have said 'caught up' with a backlog still unread. Idle is the status after
    a trigger found nothing."""
    state = MirrorState()
    starting = SimpleNamespace(recentProgress=[], status={"message": "Initializing sources", "isDataAvailable": False,
                                                          "isTriggerActive": False})
    state.update(starting)
    assert not state.idle and not state.quiet
    waiting = SimpleNamespace(recentProgress=[], status={"message": "Waiting for data to arrive",
                                                         "isDataAvailable": False, "isTriggerActive": False})
    state.update(waiting)
    assert state.idle and state.quiet


def test_a_mirror_that_runs_for_months_keeps_a_bounded_state_and_still_counts_each_batch_once() -> None:
    """A state kept an entry per committed batch for the life of the process (2.6 million a month at a 1 s trigger).
    Its size after thousands of batches (idle triggers between them) is that after a few; an event seen long ago,
    shown again, is not counted again."""
    import pickle

    state, driver = MirrorState(), Driver()

    def run(first: int, last: int) -> None:
        for batch in range(first, last):
            driver.events = [SimpleNamespace(batchId=batch, observedMetrics={}, sources=[], durationMs={}),
                             event(batch, 1, 1, None)][-1 - batch % 2:]  # every other batch after an idle trigger
            state.update(driver)

    run(0, 10)
    size = len(pickle.dumps(state))
    run(10, 5000)
    assert len(pickle.dumps(state)) < size + 64  # the counters' ints grow by a few bytes, not by one per batch
    assert (state.epoch, state.rows, state.changes) == (4999, 5000, 5000)
    assert not state.update(query(event(3, 1, 1, None), event(4999, 1, 1, None)))  # seen: not counted again
    assert state.rows == 5000
