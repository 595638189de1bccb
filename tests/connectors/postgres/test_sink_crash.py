"""flinkish.postgres under kill -9 of the driver, task failures and random kills, both commit modes.

One pipeline is killed at each protocol point in turn (as tests/sink/test_sink_crash.py does
for Parquet): run k crashes in epoch k, the next run recovers it. After every kill the
database is checked where it stands; the last run completes (with a failed first task
attempt, so Spark's retry is covered too) and the table must hold every row exactly once,
with no prepared transaction and no staged row left.

Three chains, each on a path of its own (a driver start per point is a chain's cost):

* commitMode=prepared through the format into a table with a primary key, killed at every point up to
  the commit (the last run's first attempts fail after PREPARE);
* commitMode=staged through the format, killed at every point up to the commit;
* commitMode=prepared through foreachBatch(transactional(PostgresSink)) into a table without a key
  (the last run's first attempts fail in the middle of their bulk load), killed after the decision
  (the replayed batch of a decided epoch prepares nothing: foreach_batch.py); before the decision and
  inside the commit it runs the PostgresSink tasks and commit the prepared chain is killed in.

No chain is killed after the commit (``sink.after_commit``, the format's in sink/datasource.py and
foreachBatch's in foreach_batch.py): there the decision log says done, the restart's tasks (or its batch
function) prepare nothing, commit_epoch answers ALREADY_COMMITTED without calling PostgresSink's commit,
and PostgresSink.cleanup finds nothing of the epoch left to roll back or delete (it ran before the kill).
None of that is PostgreSQL's code; tests/sink/test_sink_crash.py kills at both points for every sink.

The format and foreachBatch run the same PostgresSink tasks and commit, so a fourth chain
(prepared, format, no key) would check nothing these three do not.

The three chains and the upsert query killed at random points are one test, each in a database of its
own: a kill ends a driver, so each kill is a driver start of its own, but the last runs that need the
same task failure share one driver (one after the other, flinkish_spark.testing.queries) -- the
staged chain's, the foreachBatch chain's and the upsert's; the primary-key chain's last run fails
its tasks after PREPARE instead. Every assertion names its chain and point.
"""

from __future__ import annotations

import collections
import random
from typing import Any, Callable
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.queries import outputs

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


def kill_chain(run_pipeline: Callable[..., Any], name: str, spec: dict, db: Db, mode: str, chain: list[str],
               timeout: float = 300) -> None:
    """Run ``spec`` killed at each point of ``chain`` in turn (run k in epoch k); check each kill where it left the database."""
    for epoch, point in enumerate(chain, start=1):
        run = run_pipeline(spec, crash_at=f"{point}:2", timeout=timeout)
        assert run.killed, f"{name}: no kill at {point}: {run.output[-3000:]}"
        try:
            db.check_killed_at(point, epoch, mode)
        except AssertionError as e:
            raise AssertionError(f"{name}, killed at {point} in epoch {epoch}: {e}") from e


def last_runs(run_pipeline: Callable[..., Any], specs: dict[str, dict], fail_at: str, timeout: float = 300) -> None:
    """The named specs' last runs, one after the other in one driver; every task's first attempt fails at ``fail_at``."""
    run = run_pipeline({"queries": [{**s, "master": "local[2,4]"} for s in specs.values()]},
                       env={"FLINKISH_FAIL_AT": f"{fail_at}:first"}, timeout=timeout)
    assert run.returncode == 0, f"last runs of {list(specs)}: {run.output[-3000:]}"
    for name, out in zip(specs, outputs(run.output)):
        assert "QUERY_END=finished" in out, f"{name}'s last run: {out[-3000:]}"
        if name != "upsert":
            assert f"injected failure at {fail_at} (attempt 0)" in out, f"{name}'s last run: {out[-3000:]}"


def expected_upsert() -> dict[tuple[int, int], int]:
    want = {}
    for split, n in enumerate(LENGTHS):
        for seq in range(n):
            want[(split, seq % 37)] = seq  # the last row of each key: its highest seq
    return want


def test_crash_matrices_and_random_upsert_kills(run_pipeline, tmp_path: Path, pg_url: str, pg_server) -> None:
    def chain_db(name: str) -> tuple[Path, str]:
        return tmp_path / name, pg_server.create_database(f"{pg_url.rsplit('/', 1)[1][:40]}_{name}")

    def db(work: Path, url: str, meta: Path) -> Db:
        return Db(url, DecisionLog(FileIO.for_url(str(tmp_path)), str(meta), "out"), work / "cp")

    # commitMode=staged through the format, killed at every point up to the commit
    staged_dir, staged_url = chain_db("staged")
    staged = format_spec(staged_dir, staged_url, commitMode="staged")
    staged_db = db(staged_dir, staged_url, staged_dir / "cp" / "flinkish")
    kill_chain(run_pipeline, "staged", staged, staged_db, "staged", CHAIN[:3])

    # The common case of commitMode=prepared: append into a table with a primary key. Every replayed
    # epoch inserts the keys that the killed run's prepared transactions (or, in the last run, each
    # task's first attempt, failed after PREPARE) still hold; the runs must not hang.
    pk_dir, pk_url = chain_db("pk")
    pk = format_spec(pk_dir, pk_url, commitMode="prepared", key="split,seq")
    pk_db = db(pk_dir, pk_url, pk_dir / "cp" / "flinkish")
    kill_chain(run_pipeline, "prepared into a primary key", pk, pk_db, "prepared", CHAIN[:3], timeout=180)

    # commitMode=prepared through foreachBatch into a table without a key, killed after the decision; its
    # last run's first attempts fail in the middle of their bulk load, before PREPARE.
    fb_dir, fb_url = chain_db("fb")
    fb = {"source": source(fb_dir), "sink": {"checkpointLocation": str(fb_dir / "cp"), "foreachBatch": {
        "kind": "postgres", "uid": "out", "checkpoint": str(fb_dir / "fbmeta"), "url": fb_url, "table": "public.events",
        "createTable": True, "commitMode": "prepared"}}}
    fb_db = db(fb_dir, fb_url, fb_dir / "fbmeta")
    kill_chain(run_pipeline, "foreachBatch", fb, fb_db, "prepared", ["sink.after_decision"])

    # upsert: up to two kills at random points (the chains above are killed at every point)
    up_dir, up_url = chain_db("upsert")
    upsert = {**format_spec(up_dir, up_url, mode="upsert", key="split,k"), "select": ["split", "seq % 37 AS k", "seq", "ts"]}
    seed = random.randrange(1 << 30)
    rnd = random.Random(seed)
    for _ in range(2):
        crash = f"{rnd.choice([*CHAIN, 'source.read', 'source.partitions'])}:{rnd.randint(1, 5)}"
        run = run_pipeline(upsert, crash_at=crash)
        if not run.killed:  # the point was not hit that often: the query ended
            assert run.returncode == 0, f"upsert, seed {seed}, crash {crash}: {run.output[-3000:]}"
            break

    last_runs(run_pipeline, {"staged": staged, "foreachBatch": fb, "upsert": upsert}, "sink.write")
    last_runs(run_pipeline, {"prepared into a primary key": pk}, "sink.after_prepare", timeout=180)
    for name, chain_db_ in (("staged", staged_db), ("prepared into a primary key", pk_db), ("foreachBatch", fb_db)):
        try:
            chain_db_.check_final()
        except AssertionError as e:
            raise AssertionError(f"{name}, after the last run: {e}") from e
    assert q(pk_url, "SELECT count(*) FROM pg_index WHERE indrelid = 'events'::regclass AND indisprimary") == [(1,)]
    got = {(s, k): seq for s, k, seq in q(up_url, "SELECT split, k, seq FROM events")}
    assert got == expected_upsert(), f"upsert, seed {seed}"
    up_db = db(up_dir, up_url, up_dir / "cp" / "flinkish")
    assert up_db.prepared() == [] and up_db.staged() == 0, f"upsert, seed {seed}"
