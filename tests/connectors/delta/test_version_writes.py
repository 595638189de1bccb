"""An epoch's table versions on a local disk, staged behind one sync of the file system (issue 26,
flinkish_spark/connectors/delta/version_writes.py): the order of the writes, a version taken by another writer
between staging and linking, a failure while staging, and a kill -9 between two links -- no sink called directly
in a way a user's query would not, the tables read back with delta-rs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

deltalake = pytest.importorskip("deltalake")

TABLES = [table_schema(f"public.t_{i:02d}", [("id", "int"), ("v", "text")], ("id",)) for i in range(12)]


class Lake:
    """A routed sink (uid ``uid``) over ``root``/lake, its decision log in ``root``/meta-<uid>."""

    def __init__(self, root: Path, uid: str = "m") -> None:
        self.root, self.uid = root, uid
        self.meta = str(root / f"meta-{uid}")

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, self.uid)

    def sink(self):
        from flinkish_spark.connectors.delta.routed import RoutedDeltaSink

        return RoutedDeltaSink(FileIO.for_url(str(self.root / "lake")), Route(str(self.root / "lake" / "{schema}" / "{table}"),
                               "path"), self.uid, metadata_io=FileIO.for_url(self.meta), metadata_dir=self.log().directory)

    def commit(self, epoch: int, batch: pa.Table) -> None:
        sink = self.sink()
        prepared = [sink.prepare(iter(batch.to_batches()), PrepareContext(self.uid, epoch, 0, 0))]
        commit_epoch(self.sink(), self.log(), epoch, prepared, "run")

    def table(self, name: str):
        return deltalake.DeltaTable(str(self.root / "lake" / name.replace(".", "/")))

    def rows(self, name: str) -> list[dict]:
        return sorted(pa.table(self.table(name).scan()).to_pylist(), key=lambda r: r["id"])

    def staged_left(self) -> list[str]:
        return sorted(p.name for p in (self.root / "lake").rglob("_delta_log/.*.json.tmp-*"))


def snapshot_and_changes() -> tuple[pa.Table, pa.Table]:
    """Epoch 0: one row per table; epoch 1: every table's row updated and a row added."""
    s = StreamBuilder()
    for schema in TABLES:
        s.snapshot(schema, [{"id": 1, "v": "a"}])
    first = s.batch()
    s.transaction(*[(schema, "u", {"id": 1, "v": f"b{i}"}) for i, schema in enumerate(TABLES)])
    s.transaction(*[(schema, "c", {"id": 2, "v": "new"}) for schema in TABLES])
    return first, s.batch()


def expected(i: int) -> list[dict]:
    return [{"id": 1, "v": f"b{i}"}, {"id": 2, "v": "new"}]


def test_the_versions_are_linked_after_one_sync_that_follows_every_staged_file_and_done_follows_the_last_sync(
        tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.delta import routed, version_writes
    from flinkish_spark.io.local_disk import sync_file_systems

    events: list[tuple[str, str]] = []
    stage, publish = FileIO.stage_exclusive, FileIO.publish_staged
    mark_done = DecisionLog.mark_done

    def staged(self, path, data):
        events.append(("stage", path.split("/lake/")[1]))
        return stage(self, path, data)

    def published(self, tmp, path):
        events.append(("link", path.split("/lake/")[1]))
        return publish(self, tmp, path)

    def synced(where):
        def sync(paths, folders_too=True):
            events.append(("sync", where))
            return sync_file_systems(paths, folders_too)
        return sync

    def done(self, epoch, figures=None):
        events.append(("done", str(epoch)))
        return mark_done(self, epoch, figures)

    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(FileIO, "stage_exclusive", staged)
    monkeypatch.setattr(FileIO, "publish_staged", published)
    monkeypatch.setattr(version_writes, "sync_file_systems", synced("staged"))
    monkeypatch.setattr(routed, "sync_file_systems", synced("sink"))
    monkeypatch.setattr(DecisionLog, "mark_done", done)
    lake = Lake(tmp_path)
    first, changes = snapshot_and_changes()
    lake.commit(0, first)
    events.clear()
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd))[1])
    lake.commit(1, changes)

    kinds = [k for k, _ in events]
    # the sink's sync before any version (the tasks' files), the first table alone (written at once: no staging),
    # the other 11 staged, one sync, 11 links, the sink's sync after the last version, then .done
    assert kinds == ["sync"] + ["stage"] * 11 + ["sync"] + ["link"] * 11 + ["sync", "done"], events
    assert [w for k, w in events if k == "sync"] == ["sink", "staged", "sink"]
    assert [p for k, p in events if k == "stage"] == [p for k, p in events if k == "link"]
    assert {p.split("/")[1] for k, p in events if k == "link"} == {s.table.split(".")[1] for s in TABLES[1:]}
    # no fsync per table: the first table's version (written alone, at once), the decision record and its .done
    # (and their folder), and the checkpoints due at this version -- which tables' depends on their paths' hashes
    synced = sorted(what(p) for p in fsyncs if "checkpoint.parquet" not in p)
    assert synced == ["decision", "decisions folder", "decisions folder", "done", "version"], synced
    assert [lake.rows(s.table) for s in TABLES] == [expected(i) for i in range(len(TABLES))]
    assert lake.staged_left() == []


def what(path: str) -> str:
    """What an fsynced file or folder is, by its place."""
    name = path.rsplit("/", 1)[1]
    return ("version" if "/_delta_log/" in path else "decisions folder" if path.endswith("/decisions")
            else "decision" if ".parquet.tmp" in name and "/decisions/" in path else "done" if "/decisions/" in path
            else path.split("/lake/")[-1])


def test_a_version_another_writer_takes_between_staging_and_linking_is_read_and_the_table_committed_on_it(
        tmp_path: Path, monkeypatch) -> None:
    lake, other = Lake(tmp_path, "m"), Lake(tmp_path, "other")
    first, changes = snapshot_and_changes()
    lake.commit(0, first)
    base = lake.table(TABLES[0].table).version()
    raced = TABLES[5]
    s = StreamBuilder()
    s.transaction((raced, "c", {"id": 7, "v": "theirs"}), (raced, "u", {"id": 1, "v": "theirs"}))
    theirs = s.batch()
    publish = FileIO.publish_staged
    hits = []

    def racing(self, tmp, path):
        if f"/{raced.table.split('.')[1]}/_delta_log/" in path and not hits:
            hits.append(path)
            other.commit(0, theirs)  # another writer's version lands on the one we staged
        return publish(self, tmp, path)

    monkeypatch.setattr(FileIO, "publish_staged", racing)
    lake.commit(1, changes)

    assert hits
    assert lake.table(raced.table).version() == base + 2  # theirs, then ours on top of it
    assert lake.table(raced.table).transaction_version("other") == 0
    assert lake.table(raced.table).transaction_version("m") == 1
    # ours came after theirs: our update of key 1 wins, their new row stays
    assert lake.rows(raced.table) == [{"id": 1, "v": "b5"}, {"id": 2, "v": "new"}, {"id": 7, "v": "theirs"}]
    assert [lake.rows(s.table) for s in TABLES if s is not raced] == [expected(i) for i in range(len(TABLES)) if i != 5]
    assert lake.staged_left() == []


def test_a_failure_while_staging_removes_what_was_staged_and_the_restart_commits_each_table_once(
        tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.delta import epoch_commit

    lake = Lake(tmp_path)
    first, changes = snapshot_and_changes()
    lake.commit(0, first)
    base = lake.table(TABLES[0].table).version()
    build = epoch_commit.EpochCommit.build

    def failing(self, **kwargs):
        if self.sink.path.endswith("/t_08"):
            raise OSError(28, "No space left on device")
        return build(self, **kwargs)

    monkeypatch.setattr(epoch_commit.EpochCommit, "build", failing)
    with pytest.raises(OSError, match="No space left"):
        lake.commit(1, changes)
    assert lake.staged_left() == []  # t_01 .. t_07 had been staged: removed, never linked
    assert [lake.table(s.table).version() for s in TABLES] == [base + 1] + [base] * (len(TABLES) - 1)
    decided, done = lake.log().epochs()
    assert 1 in decided and 1 not in done

    monkeypatch.setattr(epoch_commit.EpochCommit, "build", build)
    lake.commit(1, changes)  # the restart: the decided epoch again
    assert [lake.table(s.table).version() for s in TABLES] == [base + 1] * len(TABLES)
    assert [lake.rows(s.table) for s in TABLES] == [expected(i) for i in range(len(TABLES))]


def test_a_kill_between_two_links_leaves_hidden_staged_files_that_readers_ignore_and_the_restart_commits_the_rest(
        tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_version_writes import Lake, snapshot_and_changes\n"
        "first, changes = snapshot_and_changes()\n"
        f"lake = Lake(Path({str(tmp_path)!r}))\n"
        "lake.commit(0, first)\n"
        "lake.commit(1, changes)\n"
        "print('done', flush=True)\n")
    # 12 versions in epoch 0, then epoch 1's first table alone and two linked staged ones: killed at the 15th
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "FLINKISH_CRASH_AT": "delta.keyed.after_version:15",
           "FLINKISH_CRASH_DIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr
    lake = Lake(tmp_path)
    left = lake.staged_left()
    assert len(left) == len(TABLES) - 3  # staged, never linked: the kill came before their links
    txns = [lake.table(s.table).transaction_version("m") for s in TABLES]
    assert txns == [1, 1, 1] + [0] * (len(TABLES) - 3)  # delta-rs reads every table, the hidden files ignored

    env.pop("FLINKISH_CRASH_AT")
    restarted = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert restarted.returncode == 0 and "done" in restarted.stdout, restarted.stderr
    assert [lake.table(s.table).transaction_version("m") for s in TABLES] == [1] * len(TABLES)
    versions = [lake.table(s.table).version() for s in TABLES]
    assert len(set(versions)) == 1  # each table one version for epoch 1, the first three not again
    assert [lake.rows(s.table) for s in TABLES] == [expected(i) for i in range(len(TABLES))]
