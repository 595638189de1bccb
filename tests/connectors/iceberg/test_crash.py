"""flinkish.iceberg under kill -9 at each protocol point and at random moments, with failing
first task attempts, on S3.

Pipelines run in child driver processes (conftest.run_pipeline); the table is read with
pyiceberg as a user would, and its snapshots say which epoch each one committed.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

CHAIN = ["sink.before_decision", "sink.after_decision", "sink.before_done", "sink.after_commit"]
LENGTHS = [900, 900]  # 12 epochs of 150 rows: 4 for the crash points, the rest for random kills


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


class Table:
    def __init__(self, catalog_uri: str, endpoint: str) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.catalog = SqlCatalog("flinkish", uri=catalog_uri, warehouse="s3://test/wh", **{"s3.endpoint": endpoint})
        self.io = FileIO.for_url("s3://test", {"endpoint_url": endpoint})

    def load(self):
        return self.catalog.load_table("db.events")

    def epochs(self) -> list[int]:
        return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in self.load().snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == "out")

    def last_epoch(self) -> int:
        return max(self.epochs(), default=-1)

    def epoch_files(self, epoch: int) -> list[str]:
        return self.io.find(f"s3://test/wh/db/events/data/flinkish/out/e{epoch:012d}")

    def stray_files(self) -> set[str]:
        named = {self.io.strip(f.file.file_path) for f in self.load().scan().plan_files()}
        return {p for p in self.io.find("s3://test/wh/db/events/data") if p.endswith(".parquet")} - named


ENV = {"FLINKISH_FAIL_AT": "sink.write:first"}


@pytest.mark.s3
@pytest.mark.timeout(2400)  # seven driver runs; on two cores shared with other Spark jobs one run took 2 minutes
def test_crash_matrix_then_random_kills_on_s3_with_failed_first_attempts(run_pipeline, run_with_random_kills, s3_proc: str,
                                                                          tmp_path: Path) -> None:
    """kill -9 at each protocol point in turn, then at two random moments under a processing-time
    trigger until the bounded query ends by itself; every task's first attempt fails. Each row
    once, one snapshot per epoch, no data file outside the table."""
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    s = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 150, "endpointUrl": s3_proc}},
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "table": "db.events", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "partitionBy": "split", "rowsPerFile": 60, "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    table = Table(catalog_uri, s3_proc)
    for epoch, point in enumerate(CHAIN, start=1):  # run k is killed in epoch k (the point's 2nd pass)
        run = run_pipeline(s, crash_at=f"{point}:2", env=ENV)
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        decided, done = log.epochs()
        if point == "sink.before_decision":
            assert epoch not in decided and table.epoch_files(epoch) and table.last_epoch() == epoch - 1
        elif point == "sink.after_decision":
            assert epoch in decided and epoch not in done and table.last_epoch() == epoch - 1
        elif point == "sink.before_done":
            assert epoch not in done and table.last_epoch() == epoch
        else:
            assert epoch in done and table.last_epoch() == epoch and not (tmp_path / "cp" / "commits" / str(epoch)).exists()
    last = run_with_random_kills(s, table.last_epoch, kills=2, seed=12, env=ENV)
    assert "injected failure at sink.write (attempt 0)" in last
    t = table.load().scan(selected_fields=("split", "seq")).to_arrow()
    assert collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist())) == expected()
    assert table.epochs() == list(range(12))  # one snapshot per epoch: a replay added none
    assert len(table.load().snapshots()) == 12
    assert table.stray_files() == set()
