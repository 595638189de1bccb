"""``flinkish mirror resnapshot`` as a user runs it, against a running ``tables`` mirror into routed Delta (issue 25).

Two tables, a writer inserting, updating and deleting rows of both the whole time. Once both snapshots
are committed, the target of ``r_a`` is changed behind the mirror's back (rows appended with keys the
table never had, rows deleted that it still has: what only a re-snapshot repairs), and the re-snapshot
is requested with the command. The driver is killed with kill -9 of its process group while the
re-snapshot is under way (its chunks planned, its ``E`` not committed: the bogus rows are still in the
target after the kill), the same pipeline is started again and, once the re-snapshot has ended, drained.

What a user notices: every version of the target a reader could open from the request on holds at least
half of the table's rows (never empty or partial); at the end the target equals the table and the
bogus keys are gone; the request file is gone; and the table was snapshotted again exactly once -- its
registry entry has exactly one new tid, also when the restart took the request again (a kill before
Spark logged the epoch that took it: the first taking is then no epoch's, and the second has the same tid).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psycopg
import pyarrow as pa
import pytest

from flinkish_spark.checkpoint.layout import join, source_dir
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc import resnapshot_request as requests
from flinkish_spark.finish.stop_request import request_stop
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.mirror.compare import read_delta
from flinkish_spark.testing.mirror import delta_differences, table_states

pytestmark = pytest.mark.slow

UID = "mirror"
TABLES = ["public.r_a", "public.r_b"]
ROWS_A = 6000  # splitSize 500, 2 chunks an epoch: the re-snapshot spans several epochs, the kill lands inside
SETUP = f"""
CREATE TABLE r_a (id int PRIMARY KEY, v int, t text);
CREATE TABLE r_b (id int PRIMARY KEY, v int);
INSERT INTO r_a SELECT g, g, 'a' || g FROM generate_series(1, {ROWS_A}) g;
INSERT INTO r_b SELECT g, g FROM generate_series(1, 1000) g;
"""
WRITTEN = (30, 1000)  # the keys the writer updates and deletes (inserts: 100000 on)
BOGUS = list(range(-50, 0))  # keys r_a never has
DELETED_BY_HAND = list(range(10, 30))  # rows of r_a deleted from the target only


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    meta = str(tmp_path / "meta")
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": UID, "checkpoint": meta, "url": url, "tables": "public.r_*",
            "splitSize": 500, "maxRowsPerTrigger": 1000, "discoveryInterval": 1,
            "rowFormat": "arrow", "decodeIn": "sink"}},  # the shape flinkish mirror reads to a lakehouse
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": meta, "path": str(tmp_path / "lake") + "/{schema}/{table}"}},
        "trigger": "1 second",
        "end": "external",
        "runSeconds": 240,
        **extra,
    }


def write(url: str, stop: threading.Event) -> None:
    """Inserts, updates and deletes on both tables until ``stop``."""
    rnd = random.Random(25)
    next_id = 100_000
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            table, k, op = rnd.choice(["r_a", "r_b"]), rnd.randint(*WRITTEN), rnd.random()
            if op < 0.6:
                conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s", (k,))
            elif op < 0.8:
                conn.execute(f"INSERT INTO {table} (id, v) VALUES (%s, 1)", (next_id,))
                next_id += 1
            else:
                conn.execute(f"DELETE FROM {table} WHERE id = %s", (k,))
            time.sleep(0.005)


def committed_registry(io: FileIO, meta: str) -> registry.Registry | None:
    """The registry of the source's newest checkpoint (what a restart continues from)."""
    latest = SourceCheckpointStore(io, meta, UID, kind="").latest()
    return None if latest is None else registry.of_state(io, source_dir(meta, UID), latest.enumerator_state)


def newest_registry(io: FileIO, meta: str) -> registry.Registry | None:
    """The newest registry file (written by the planning under way, before Spark logs its epoch)."""
    directory = source_dir(meta, UID)
    names = sorted(n for n in io.list_names(join(directory, registry.FOLDER)) if n.startswith("v"))
    return registry.read(io, directory, names[-1]) if names else None


def entry(reg: registry.Registry | None, table: str) -> registry.TableEntry | None:
    return next((e for e in reg.entries if e.name == table), None) if reg is not None else None


def wait_for(what: str, condition: Callable[[], bool], runner: threading.Thread, timeout: float = 200,
             detail: Callable[[], object] = lambda: "") -> None:
    deadline = time.time() + timeout
    while not condition():
        assert runner.is_alive(), f"the pipeline ended while waiting for {what} {detail()}"
        assert time.time() < deadline, f"timed out waiting for {what} {detail()}"
        time.sleep(0.3)


def behind_the_back(write: Callable[[], object], attempts: int = 10) -> None:
    """A concurrent write to a target the mirror commits to: a lost commit race is tried again."""
    import deltalake

    for attempt in range(attempts):
        try:
            write()
            return
        except deltalake.exceptions.CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)


def ids(table: pa.Table) -> set[int]:
    return set(table.column("id").to_pylist())


def test_a_requested_resnapshot_through_kill_9_ends_with_the_target_equal_and_never_empty(pg_url: str, run_pipeline,
                                                                                          tmp_path: Path) -> None:
    pytest.importorskip("deltalake")
    import deltalake

    meta, target = str(tmp_path / "meta"), str(tmp_path / "lake" / "public" / "r_a")
    io = FileIO.for_url(meta)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    stop_writer = threading.Event()
    writer = threading.Thread(target=write, args=(pg_url, stop_writer), daemon=True)
    runs: dict[str, Any] = {}
    state: dict[str, Any] = {}

    def renewing() -> bool:  # the re-snapshot's chunks are planned (B comes with the first of them)
        e = entry(newest_registry(io, meta), "public.r_a")
        return e is not None and e.tid == state.get("new_tid") and e.state == "snapshot"

    def ended() -> bool:  # the epoch holding E is committed: r_a streams again, under the new tid
        e = entry(committed_registry(io, meta), "public.r_a")
        return e is not None and (e.tid, e.state) == (state.get("new_tid"), "streaming")

    first = threading.Thread(target=lambda: runs.setdefault("first", run_pipeline(
        spec(tmp_path, pg_url), kill_after=2.5, kill_when=renewing, timeout=300)))
    second = threading.Thread(target=lambda: runs.setdefault("second", run_pipeline(
        spec(tmp_path, pg_url), timeout=300)))
    writer.start()
    first.start()
    try:
        wait_for("both snapshots committed", lambda: {getattr(entry(committed_registry(io, meta), t), "state", None)
                                                      for t in TABLES} == {"streaming"}, first)
        wait_for("the target of r_a", lambda: read_delta(target) is not None, first)
        start = committed_registry(io, meta)
        assert start is not None
        old = {t: entry(start, t) for t in TABLES}
        state["new_tid"] = start.next_tid  # the one tid a re-snapshot of r_a gets (no other table joins)

        # Behind the mirror's back: keys the table never had, and rows it has deleted from the target only.
        schema = read_delta(target).schema
        bogus = pa.table({"id": BOGUS, "v": [0] * len(BOGUS), "t": ["bogus"] * len(BOGUS)}).select(schema.names)
        # The mirror keeps committing meanwhile (its first change epochs drop the snapshot's ahead map with a
        # metaData action, which delta-rs lets no concurrent writer commit over): retried, as a user would.
        behind_the_back(lambda: deltalake.write_deltalake(target, bogus.cast(schema), mode="append"))
        behind_the_back(lambda: deltalake.DeltaTable(target).delete(
            f"id >= {DELETED_BY_HAND[0]} AND id <= {DELETED_BY_HAND[-1]}"))
        changed = deltalake.DeltaTable(target).version()
        corrupted = ids(read_delta(target))
        assert set(BOGUS) <= corrupted and not set(DELETED_BY_HAND) & corrupted

        asked = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "mirror", "resnapshot",
                                "--checkpoint", meta, "public.r_a"], capture_output=True, text=True, timeout=60)
        assert asked.returncode == 0, asked.stderr
        assert f"source uid {UID}: the next epoch starts re-reading public.r_a;" in asked.stdout, asked.stdout

        wait_for("the re-snapshot's chunks to be planned", renewing, first, timeout=120,
                 detail=lambda: entry(newest_registry(io, meta), "public.r_a"))
        first.join(timeout=120)
        run = runs.get("first")
        assert run is not None and run.killed, run.output[-4000:] if run is not None else "no run"
        assert run.output.count("snapshotting public.r_a again") == 1, run.output[-4000:]
        # The kill landed inside the re-snapshot: its E was not committed, the bogus rows are still there.
        assert set(BOGUS) <= ids(read_delta(target)), "the kill came after the re-snapshot ended"

        second.start()
        wait_for("the re-snapshot to end (r_a streaming under the one new tid)", ended, second,
                 detail=lambda: entry(committed_registry(io, meta), "public.r_a"))
        time.sleep(3)  # changes after the re-snapshot too
        stop_writer.set()
        writer.join(timeout=30)
        request_stop(io, meta, UID, drain=True)
        second.join(timeout=300)
    finally:
        stop_writer.set()
        for runner in (first, second):
            if runner.is_alive():  # a failed wait: end the run instead of waiting for its timeout
                request_stop(io, meta, UID, drain=False)
                runner.join(timeout=120)
    run = runs.get("second")
    assert run is not None and run.returncode == 0 and "QUERY_END=drained" in run.output, \
        run.output[-4000:] if run is not None else "no run"
    # Taken again only by a restart from before the epoch that took it: then with the same tid.
    assert run.output.count("snapshotting public.r_a again") <= 1, run.output[-4000:]

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    final = ids(read_delta(target))
    assert not set(BOGUS) & final and set(DELETED_BY_HAND) <= final

    # Every version a reader could have opened since the target was changed holds every row the table held
    # all along (the keys the writer never touches): never empty, never partial.
    kept = set(range(WRITTEN[1] + 1, ROWS_A + 1))
    last = deltalake.DeltaTable(target).version()
    partial = {v: len(kept - ids(pa.table(deltalake.DeltaTable(target, version=v).scan())))
               for v in range(changed, last + 1)}
    assert {v: n for v, n in partial.items() if n} == {}, "versions lacking rows the table held all along"

    # Exactly once: r_a has exactly one new tid, r_b the one it had; no request left.
    end = committed_registry(io, meta)
    assert entry(end, "public.r_a") is not None and entry(end, "public.r_a").tid == state["new_tid"]
    assert (entry(end, "public.r_b").tid, entry(end, "public.r_b").state) == (old["public.r_b"].tid, "streaming")
    assert end is not None and end.next_tid == state["new_tid"] + 1
    assert [n for n in io.list_names(requests.folder(source_dir(meta, UID))) if n.endswith(".json")] == []
