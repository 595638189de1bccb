"""What the Iceberg crash tests read back: a table of the sink's SQL catalog on S3, as a user's pyiceberg sees it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog


class S3Table:
    def __init__(self, catalog_uri: str, endpoint: str, name: str, uid: str = "out") -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        self.catalog = SqlCatalog("flinkish", uri=catalog_uri, warehouse="s3://test/wh", **{"s3.endpoint": endpoint})
        self.io = FileIO.for_url("s3://test", {"endpoint_url": endpoint})
        self.name, self.uid = name, uid
        self.data = f"s3://test/wh/{name.replace('.', '/')}/data"

    def load(self) -> Any:
        return self.catalog.load_table(self.name)

    def epochs(self) -> list[int]:
        """The epochs of the uid's snapshots, one entry per snapshot."""
        if not self.catalog.table_exists(self.name):
            return []
        return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in self.load().snapshots()
                      if s.summary.additional_properties.get("flinkish.uid") == self.uid)

    def last_epoch(self) -> int:
        return max(self.epochs(), default=-1)

    def epoch_files(self, epoch: int) -> list[str]:
        return self.io.find(f"{self.data}/flinkish/{self.uid}/e{epoch:012d}")

    def stray_files(self) -> set[str]:
        """Files below the table's data folder that neither a live data file nor a live delete file is."""
        named = set()
        for task in self.load().scan().plan_files():
            named.add(self.io.strip(task.file.file_path))
            named.update(self.io.strip(d.file_path) for d in task.delete_files)
        return set(self.io.find(self.data)) - named


CHAIN = ["sink.before_decision", "sink.after_decision", "sink.before_done", "sink.after_commit"]


def _kill_at_each_point(run_pipeline: Any, spec: dict[str, Any], table: S3Table, cp: Path,
                       env: dict[str, str] | None = None, chain: list[str] = CHAIN, name: str = "") -> None:
    """Run ``spec`` once per protocol point, killed (-9) at the point's second pass -- run k in epoch k --
    and check what each kill left: decided / done in the decision log, the epoch in the table or not.
    ``name`` (the matrix) starts every failure's message."""
    log = DecisionLog(FileIO.for_url(str(cp)), str(cp / "flinkish"), table.uid)
    for epoch, point in enumerate(chain, start=1):
        run = run_pipeline(spec, crash_at=f"{point}:2", env=env)
        assert run.killed, f"{name}: no kill at {point}: {run.output[-3000:]}"
        try:
            _check_killed_at(point, epoch, table, log, cp)
        except AssertionError as e:
            raise AssertionError(f"{name}, killed at {point} in epoch {epoch}: {e}") from e


def _check_killed_at(point: str, epoch: int, table: S3Table, log: DecisionLog, cp: Path) -> None:
    decided, done = log.epochs()
    if point == "sink.before_decision":
        assert epoch not in decided and table.epoch_files(epoch) and table.last_epoch() == epoch - 1
    elif point == "sink.after_decision":
        assert epoch in decided and epoch not in done and table.last_epoch() == epoch - 1
    elif point == "iceberg.keyed.before_snapshot":  # the driver wrote the epoch's delete files, no snapshot
        assert epoch in decided and epoch not in done and table.last_epoch() == epoch - 1
        assert any("/deletes/" in f for f in table.epoch_files(epoch)), table.epoch_files(epoch)
    elif point == "sink.before_done":
        assert epoch not in done and table.last_epoch() == epoch
    else:
        assert epoch in done and table.last_epoch() == epoch and not (cp / "commits" / str(epoch)).exists()


@pytest.fixture
def s3_table() -> type[S3Table]:
    return S3Table


@pytest.fixture
def kill_at_each_point() -> Any:
    return _kill_at_each_point
