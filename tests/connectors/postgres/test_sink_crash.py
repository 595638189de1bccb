"""flinkish.postgres under kill -9 of the driver, task failures and random kills, both commit modes.

One pipeline is killed at each protocol point in turn (as tests/sink/test_sink_crash.py does
for Parquet): run k crashes in epoch k, the next run recovers it. After every kill the
database is checked where it stands; the last run completes (with a failed first task
attempt, so Spark's retry is covered too) and the table must hold every row exactly once,
with no prepared transaction and no staged row left.

Three chains, each on a path of its own (a driver start per point is a chain's cost):

* commitMode=prepared through the format into a table with a primary key, killed at every point
  (the last run's first attempts fail after PREPARE);
* commitMode=staged through the format, killed at every point up to the commit: at
  ``sink.after_commit`` the decision log says done and the restart never reaches the sink's commit
  (sink/committer.py), as in the prepared chain;
* commitMode=prepared through foreachBatch(transactional(PostgresSink)) into a table without a key
  (the last run's first attempts fail in the middle of their bulk load), killed after the decision
  (the replayed batch of a decided epoch prepares nothing: foreach_batch.py) and after the commit
  (foreach_batch.py's own point); before the decision and inside the commit it runs the PostgresSink
  tasks and commit the prepared chain is killed in.

The format and foreachBatch run the same PostgresSink tasks and commit, so a fourth chain
(prepared, format, no key) would check nothing these three do not.
"""

from __future__ import annotations

import collections
import random
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

pytestmark = pytest.mark.slow
CHAIN = ["sink.before_decision", "sink.after_decision", "sink.mid_commit", "sink.after_commit"]
LENGTHS = [500, 400]


def q(url: str, sql: str, *params) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        return c.execute(sql, params or None).fetchall()


def source(tmp_path: Path) -> dict:
    return {"format": "flinkish.sequence", "options": {
        "uid": "seq", "checkpoint": str(tmp_path / "meta"), "rowsPerSplit": ",".join(map(str, LENGTHS)), "maxRowsPerTrigger": 150}}


def format_spec(tmp_path: Path, url: str, **options: str) -> dict:
    return {"source": source(tmp_path), "sink": {"format": "flinkish.postgres", "checkpointLocation": str(tmp_path / "cp"),
            "options": {"uid": "out", "url": url, "table": "public.events", "createTable": "true", **options}}}


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


class Db:
    def __init__(self, url: str, log: DecisionLog, cp: Path) -> None:
        self.url, self.log, self.cp = url, log, cp

    def prepared(self, epoch: int | None = None) -> list[str]:
        prefix = "flinkish/out/" + ("" if epoch is None else f"{epoch}/")
        return [r[0] for r in q(self.url, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
                                "AND starts_with(gid, %s)", prefix)]

    def staged(self, epoch: int | None = None) -> int:
        tables = q(self.url, "SELECT tablename FROM pg_tables WHERE tablename LIKE 'flinkish_staging%%'")
        total = 0
        for (t,) in tables:
            where = "" if epoch is None else f" WHERE _flinkish_epoch = {epoch}"
            total += q(self.url, f'SELECT count(*) FROM "{t}"{where}')[0][0]
        return total

    def recorded(self, epoch: int) -> bool:
        return bool(q(self.url, "SELECT 1 FROM flinkish_commits WHERE sink_uid = 'out' AND epoch = %s", epoch))

    def check_consistent(self) -> None:
        """At every kill: the table holds exactly the rows flinkish_commits says were committed."""
        table = q(self.url, "SELECT count(*) FROM events")[0][0] if q(self.url, "SELECT to_regclass('events')")[0][0] else 0
        recorded = q(self.url, "SELECT coalesce(sum(rows), 0) FROM flinkish_commits WHERE sink_uid = 'out'")[0][0] \
            if q(self.url, "SELECT to_regclass('flinkish_commits')")[0][0] else 0
        assert table == recorded

    def check_killed_at(self, point: str, epoch: int, mode: str) -> None:
        decided, done = self.log.epochs()
        self.check_consistent()
        waiting = self.prepared(epoch) if mode == "prepared" else self.staged(epoch)
        if point == "sink.before_decision":  # prepared by the tasks, not decided, nothing visible
            assert epoch not in decided and waiting and not self.recorded(epoch)
        elif point == "sink.after_decision":  # decided, nothing visible yet
            assert epoch in decided and epoch not in done and waiting and not self.recorded(epoch)
        elif point == "sink.mid_commit":
            assert epoch in decided and epoch not in done and waiting
            # prepared: one partition's COMMIT PREPARED done, the next not; staged: the one
            # driver transaction was open, so nothing of the epoch is visible
            assert self.recorded(epoch) == (mode == "prepared")
        else:  # committed in PostgreSQL; Spark's commit log does not have it
            assert epoch in done and self.recorded(epoch) and not waiting
            assert not (self.cp / "commits" / str(epoch)).exists()

    def check_final(self) -> None:
        assert collections.Counter(q(self.url, "SELECT split, seq FROM events")) == expected()
        assert self.prepared() == [] and self.staged() == 0
        assert q(self.url, "SELECT gid FROM pg_prepared_xacts") == []


def run_chain(run_pipeline, spec: dict, db: Db, mode: str, fail_at: str = "sink.write", timeout: float = 300,
              chain: list[str] = CHAIN) -> None:
    for epoch, point in enumerate(chain, start=1):
        run = run_pipeline(spec, crash_at=f"{point}:2", timeout=timeout)
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        db.check_killed_at(point, epoch, mode)
    # The last run: every task's first attempt fails (by default in the middle of its bulk load).
    last = run_pipeline({**spec, "master": "local[2,4]"}, env={"FLINKISH_FAIL_AT": f"{fail_at}:first"}, timeout=timeout)
    assert last.returncode == 0, last.output[-3000:]
    assert f"injected failure at {fail_at} (attempt 0)" in last.output
    db.check_final()


def test_crash_matrix_staged(run_pipeline, tmp_path: Path, pg_url: str) -> None:
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    run_chain(run_pipeline, format_spec(tmp_path, pg_url, commitMode="staged"), Db(pg_url, log, tmp_path / "cp"), "staged",
              chain=CHAIN[:3])


def test_crash_matrix_prepared_into_a_primary_key(run_pipeline, tmp_path: Path, pg_url: str) -> None:
    """The common case of commitMode=prepared: append into a table with a primary key. Every
    replayed epoch inserts the keys that the killed run's prepared transactions (or, in the last
    run, each task's first attempt, failed after PREPARE) still hold; the runs must not hang."""
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    spec = format_spec(tmp_path, pg_url, commitMode="prepared", key="split,seq")
    run_chain(run_pipeline, spec, Db(pg_url, log, tmp_path / "cp"), "prepared", fail_at="sink.after_prepare", timeout=180)
    assert q(pg_url, "SELECT count(*) FROM pg_index WHERE indrelid = 'events'::regclass AND indisprimary") == [(1,)]


def test_crash_matrix_foreach_batch(run_pipeline, tmp_path: Path, pg_url: str) -> None:
    """commitMode=prepared through foreachBatch into a table without a key, killed after the decision and
    after the commit; the last run's first attempts fail in the middle of their bulk load, before PREPARE."""
    spec = {"source": source(tmp_path), "sink": {"checkpointLocation": str(tmp_path / "cp"), "foreachBatch": {
        "kind": "postgres", "uid": "out", "checkpoint": str(tmp_path / "fbmeta"), "url": pg_url, "table": "public.events",
        "createTable": True, "commitMode": "prepared"}}}
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "fbmeta"), "out")
    run_chain(run_pipeline, spec, Db(pg_url, log, tmp_path / "cp"), "prepared", chain=["sink.after_decision", "sink.after_commit"])


def test_upsert_killed_at_random_until_done_holds_last_value_per_key(run_pipeline, tmp_path: Path, pg_url: str) -> None:
    spec = {**format_spec(tmp_path, pg_url, mode="upsert", key="split,k"),
            "select": ["split", "seq % 37 AS k", "seq", "ts"]}
    points = [*CHAIN, "source.read", "source.partitions"]
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    # Up to two kills at random points (the chains above are killed at every point), then a run to the end.
    for attempt in range(3):
        crash = f"{rnd.choice(points)}:{rnd.randint(1, 5)}" if attempt < 2 else None
        run = run_pipeline(spec, crash_at=crash)
        if not run.killed:
            assert run.returncode == 0, f"seed {seed}, crash {crash}: {run.output[-3000:]}"
            break
    else:
        raise AssertionError(f"seed {seed}: never finished")
    want = {}
    for split, n in enumerate(LENGTHS):
        for seq in range(n):
            want[(split, seq % 37)] = seq  # the last row of each key: its highest seq
    got = {(s, k): seq for s, k, seq in q(pg_url, "SELECT split, k, seq FROM events")}
    assert got == want, f"seed {seed}"
    db = Db(pg_url, DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out"), tmp_path / "cp")
    assert db.prepared() == [] and db.staged() == 0
