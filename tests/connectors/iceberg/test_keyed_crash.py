"""flinkish.iceberg in upsert mode under kill -9 at each protocol point, on S3: after the tasks
wrote their data files (sink.before_decision), after the decision, after the commit (before the
decision log says done), and after the commit before Spark's commit log. Each restart replays
the epoch; the table must end exact -- every key holds its last change, deleted keys are gone --
with one snapshot per epoch and no file on storage that the table does not name."""

from __future__ import annotations

from pathlib import Path

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

CHAIN = ["sink.before_decision", "sink.after_decision", "sink.before_done", "sink.after_commit"]
ROWS, PER_EPOCH, KEYS = 1200, 150, 50  # 8 epochs, each changing every key about three times


def expected() -> dict[int, str]:
    state: dict[int, str] = {}
    for seq in range(ROWS):
        if seq % 7 == 0:
            state.pop(seq % KEYS, None)
        else:
            state[seq % KEYS] = f"v{seq}"
    return state


class Table:
    def __init__(self, catalog_uri: str, endpoint: str) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.catalog = SqlCatalog("flinkish", uri=catalog_uri, warehouse="s3://test/wh", **{"s3.endpoint": endpoint})
        self.io = FileIO.for_url("s3://test", {"endpoint_url": endpoint})

    def load(self):
        return self.catalog.load_table("db.mirror")

    def epochs(self) -> list[int]:
        if not self.catalog.table_exists("db.mirror"):
            return []
        return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in self.load().snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == "out")

    def last_epoch(self) -> int:
        return max(self.epochs(), default=-1)

    def rows(self) -> dict[int, str]:
        t = self.load().scan(selected_fields=("id", "v")).to_arrow()
        ids = t["id"].to_pylist()
        assert len(ids) == len(set(ids)), "a key is in the table twice"
        return dict(zip(ids, t["v"].to_pylist()))

    def stray_files(self) -> set[str]:
        """Files below the table's data folder that neither a live data file nor a live delete file is."""
        named = set()
        for task in self.load().scan().plan_files():
            named.add(self.io.strip(task.file.file_path))
            named.update(self.io.strip(d.file_path) for d in task.delete_files)
        return set(self.io.find("s3://test/wh/db/mirror/data")) - named


@pytest.mark.s3
@pytest.mark.timeout(2400)
def test_upsert_crash_matrix_on_s3(run_pipeline, s3_proc: str, tmp_path: Path) -> None:
    catalog_uri = f"sqlite:///{tmp_path}/catalog.db"
    s = {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": str(ROWS), "maxRowsPerTrigger": PER_EPOCH,
            "endpointUrl": s3_proc}},
        "select": [f"seq % {KEYS} AS id", "concat('v', seq) AS v",
                   "CASE WHEN seq % 7 = 0 THEN 'd' ELSE 'u' END AS _op", "seq AS _lsn"],
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "table": "db.mirror", "catalogUri": catalog_uri, "warehouse": "s3://test/wh",
            "mode": "upsert", "key": "id", "deletes": "true", "endpointUrl": s3_proc}},
        "master": "local[2,4]",
    }
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    table = Table(catalog_uri, s3_proc)
    for epoch, point in enumerate(CHAIN, start=1):  # run k is killed in epoch k (the point's 2nd pass)
        run = run_pipeline(s, crash_at=f"{point}:2")
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        decided, done = log.epochs()
        if point == "sink.before_decision":
            assert epoch not in decided and table.last_epoch() == epoch - 1
            assert table.io.find(f"s3://test/wh/db/mirror/data/flinkish/out/e{epoch:012d}")  # the tasks' files
        elif point == "sink.after_decision":
            assert epoch in decided and epoch not in done and table.last_epoch() == epoch - 1
        elif point == "sink.before_done":
            assert epoch not in done and table.last_epoch() == epoch
        else:
            assert epoch in done and table.last_epoch() == epoch and not (tmp_path / "cp" / "commits" / str(epoch)).exists()
    last = run_pipeline(s)
    assert last.returncode == 0 and "QUERY_END=finished" in last.output, last.output[-3000:]
    assert table.rows() == expected()
    # one snapshot per Spark batch (an epoch without rows commits its marker too): a replay added none
    batches = sorted(int(p.name) for p in (tmp_path / "cp" / "commits").iterdir() if p.name.isdigit())
    assert table.epochs() == batches and len(batches) >= ROWS // PER_EPOCH
    assert table.stray_files() == set()
    snap = table.load().current_snapshot()
    assert snap.summary.operation.value == "overwrite" and int(snap.summary["total-position-deletes"]) > 0
