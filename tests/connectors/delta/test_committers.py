"""The routed Delta sink's committer processes (option ``commitProcesses``), in process (no Spark): the sink's
prepare and the decision log's commit called directly, the targets read back with delta-rs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse.routing import Route
from flinkish_spark.errors import SchemaChangeError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.committer import commit_epoch
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.sink.protocol import PrepareContext
from flinkish_spark.testing.stream_rows import StreamBuilder, table_schema

deltalake = pytest.importorskip("deltalake")

TABLES = [table_schema(f"public.t_{i:02d}", [("id", "int"), ("v", "bigint"), ("s", "text")], ("id",)) for i in range(20)]


class Lake:
    """A routed sink with ``processes`` committers over a lake below ``root``; :meth:`epoch` prepares and commits."""

    def __init__(self, root: Path, processes: int, uid: str = "m") -> None:
        self.root, self.processes, self.uid = root, processes, uid
        self.meta = str(root / "meta")
        self.epochs = 0

    def log(self) -> DecisionLog:
        return DecisionLog(FileIO.for_url(self.meta), self.meta, self.uid)

    def sink(self):  # a new instance per epoch, as Spark unpickles it for each commit
        from flinkish_spark.connectors.delta.routed import RoutedDeltaSink

        return RoutedDeltaSink(FileIO.for_url(str(self.root / "lake")), Route(str(self.root / "lake" / "{schema}" / "{table}"),
                               "path"), self.uid, checkpoint_interval=3, metadata_io=FileIO.for_url(self.meta),
                               metadata_dir=self.log().directory, commit_processes=self.processes)

    def prepared(self, batch: pa.Table) -> list:
        return [self.sink().prepare(iter(batch.to_batches()), PrepareContext(self.uid, self.epochs, 0, 0))]

    def commit(self, prepared: list) -> None:
        commit_epoch(self.sink(), self.log(), self.epochs, prepared, "run")

    def epoch(self, batch: pa.Table) -> None:
        self.commit(self.prepared(batch))
        self.epochs += 1

    def table(self, name: str):
        return deltalake.DeltaTable(str(self.root / "lake" / name.replace(".", "/")))

    def seen(self) -> dict[str, tuple[list[dict], int, int | None]]:
        """Per table: its rows, its version, the uid's txn."""
        out = {}
        for schema in TABLES:
            t = self.table(schema.table)
            out[schema.table] = (sorted(pa.table(t.scan()).to_pylist(), key=lambda r: r["id"]), t.version(),
                                 t.transaction_version(self.uid))
        return out


def batches(epochs: int) -> list[pa.Table]:
    """A snapshot of every table, then epochs of inserts, updates and deletes (not every table in every epoch)."""
    s = StreamBuilder()
    for schema in TABLES:
        s.snapshot(schema, [{"id": i, "v": 0, "s": "x"} for i in range(1, 9)])
    out = [s.batch()]
    for e in range(1, epochs):
        changes = []
        for n, schema in enumerate(TABLES):
            if (n + e) % 4 == 0:
                continue  # quiet in this epoch
            changes += [(schema, "u", {"id": 1 + (e + n) % 8, "v": e, "s": f"u{e}"}),
                        (schema, "c", {"id": 100 + e, "v": e, "s": "new"}),
                        (schema, "d", {"id": 1 + (e + n + 3) % 8, "v": 0, "s": "x"})]
        s.transaction(*changes)
        out.append(s.batch())
    return out


@pytest.fixture(autouse=True)
def _no_committers_left():
    yield
    from flinkish_spark.connectors.delta import committers

    for pool in list(committers._POOLS.values()):
        pool.close()
    committers._POOLS.clear()


def test_two_committer_processes_write_the_same_targets_as_the_in_process_commit(tmp_path: Path) -> None:
    # Another uid for the in-process commit: an in-process commit of a uid stops that uid's committers.
    threads, processes = Lake(tmp_path / "threads", 0, "t"), Lake(tmp_path / "processes", 2)
    for batch in batches(4):
        threads.epoch(batch)
        processes.epoch(batch)
    assert processes.seen() == threads.seen()  # rows, versions, each table's txn of its uid
    assert {txn for _, _, txn in processes.seen().values()} == {2, 3}  # quiet tables keep an older epoch
    from flinkish_spark.connectors.delta import committers

    pids = committers._POOLS["m"].pids()
    assert len(pids) == 2 and os.getpid() not in pids  # the tables were committed in two other processes

    # A change one table's target cannot follow (bigint narrowed to int), found in a committer: the error the
    # in-process commit raises, and no table -- of either process -- gets the epoch.
    narrowed = table_schema(TABLES[-1].table, [("id", "int"), ("v", "int"), ("s", "text")], ("id",))
    s = StreamBuilder()
    s.transaction(*[(t, "u", {"id": 1, "v": 9, "s": "n"}) for t in TABLES[:-1]], (narrowed, "u", {"id": 1, "v": 9, "s": "n"}))
    before = processes.seen()
    with pytest.raises(SchemaChangeError, match=TABLES[-1].table):
        processes.epoch(s.batch())
    assert processes.seen() == before


def test_a_committer_killed_mid_epoch_fails_the_commit_and_the_restart_commits_each_table_once(
        tmp_path: Path, monkeypatch) -> None:
    from flinkish_spark.connectors.delta.committers import CommitterCrashedError

    reference, lake = Lake(tmp_path / "reference", 0), Lake(tmp_path / "killed", 2)
    epochs = batches(3)
    for batch in epochs:
        reference.epoch(batch)
    # The committers inherit the armed crash point: the 20 tables' versions of epoch 0, then in epoch 1 the first
    # table alone and a few of the others -- the committer that reaches the 25th is killed (os._exit) before it.
    monkeypatch.setenv("FLINKISH_CRASH_AT", "delta.keyed.before_version:25")
    monkeypatch.setenv("FLINKISH_CRASH_DIR", str(tmp_path))
    lake.epoch(epochs[0])
    prepared = lake.prepared(epochs[1])
    with pytest.raises(CommitterCrashedError, match="died during the commit.*a restart commits it again"):
        lake.commit(prepared)
    decided, done = lake.log().epochs()
    assert 1 in decided and 1 not in done
    txns = [lake.table(s.table).transaction_version("m") for s in TABLES]
    assert 0 < txns.count(1) < 15  # some of the 15 tables epoch 1 changes have it, not all
    lake.commit(prepared)  # the restart's recover-and-commit of the decided epoch, with new committers
    lake.epochs += 1
    lake.epoch(epochs[2])
    assert lake.seen() == reference.seen()  # the same versions: no table got epoch 1 twice


def test_the_committers_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        "import os, sys, time\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "from test_committers import Lake, batches\n"
        "from flinkish_spark.connectors.delta import committers\n"
        "if __name__ == '__main__':\n"
        f"    lake = Lake(Path({str(tmp_path)!r}), 2)\n"
        "    lake.epoch(batches(1)[0])\n"
        "    print(' '.join(map(str, committers._POOLS['m'].pids())), flush=True)\n"
        "    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]  # type: ignore[union-attr]
        assert len(pids) == 2 and all(running(p) for p in pids)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in pids if running(p)]


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited child nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_committers_cleanup_removes_a_failed_attempts_file_also_when_the_epoch_is_replayed(tmp_path: Path) -> None:
    """The cleanup after ``.done`` runs in the committers on the tables their check got (a cleanup of that epoch
    names them only): a file a failed task attempt left in a table's epoch folder goes, the version's files stay."""
    from flinkish_spark.connectors.lakehouse.files import epoch_dir

    lake = Lake(tmp_path, 2)
    epochs = batches(2)
    lake.epoch(epochs[0])
    prepared = lake.prepared(epochs[1])
    table = str(tmp_path / "lake" / "public" / "t_01")
    folder = Path(epoch_dir(table, "flinkish", "m", 1))
    failed = folder / "00000-1-failed-attempt.parquet"  # what an executor that died mid-task leaves
    failed.write_bytes(b"PAR1 half a file")
    lake.commit(prepared)
    assert not failed.exists()
    kept = sorted(p.name for p in folder.iterdir())
    assert kept and lake.seen() == Lake(tmp_path, 2).seen()  # the version's files are there: the table reads

    failed.write_bytes(b"PAR1 half a file")  # and once more, for Spark's replay of the done epoch
    lake.commit(prepared)
    assert not failed.exists() and sorted(p.name for p in folder.iterdir()) == kept
