"""A drained (or finished) mirror started again: one line and exit 0 from the metadata, without starting Spark.

Spark's checkpoint is written here as Spark writes it (``offsets/N``, ``commits/N``): the state a drained mirror
leaves behind, so no Spark query is needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from flinkish_spark.connectors.postgres.slot import Ownership
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.mirror.config import from_args
from flinkish_spark.mirror.finished import ended_before
from flinkish_spark.testing.spark_log import write_batch


def spark_log(spark_cp: Path, batch: int, offset: dict, committed: bool = True) -> None:
    write_batch(spark_cp, batch, [offset], committed)


def finished(meta: Path, ckpt: int, stop: str | None = "req1") -> dict:
    return {"v": 1, "uid": "mirror", "ckpt": ckpt, "status": "FINISHED", "root": str(meta),
            **({"stop": stop} if stop else {})}


def mirror_cmd(url: str, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "flinkish_spark.cli", "mirror", "--from", url, "--tables", "public.*",
            "--to", str(tmp_path / "lake"), "--checkpoint", str(tmp_path / "meta")]


def test_a_drained_mirror_started_again_says_so_in_one_line_without_spark(tmp_path: Path) -> None:
    spark_log(tmp_path / "meta" / "spark", 0, {**finished(tmp_path / "meta", 0), "status": "RUNNING"})
    spark_log(tmp_path / "meta" / "spark", 1, finished(tmp_path / "meta", 1))
    began = time.monotonic()
    out = subprocess.run(mirror_cmd("postgresql://nobody@127.0.0.1:1/none", tmp_path), capture_output=True,
                         text=True, timeout=120)
    took = time.monotonic() - began
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1 and "this mirror was drained before" in lines[0], out.stdout + out.stderr
    assert "starting Spark" not in out.stdout and took < 10, (took, out.stdout)
    assert not os.path.exists(tmp_path / "lake")


def test_not_ended_while_the_last_batch_is_uncommitted_or_the_slot_is_still_there(pg_url: str, tmp_path: Path) -> None:
    meta, spark_cp = tmp_path / "meta", tmp_path / "meta" / "spark"
    config = from_args(source=pg_url, tables="public.*", to=str(tmp_path / "lake"), fmt=None, checkpoint=str(meta))
    assert ended_before(config) is None  # a fresh mirror
    spark_log(spark_cp, 0, finished(meta, 0), committed=False)
    assert ended_before(config) is None  # the final epoch is planned, not committed: Spark must run it
    spark_log(spark_cp, 0, finished(meta, 0))
    directory = meta / "sources" / "mirror"
    directory.mkdir(parents=True)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        database = conn.execute("SELECT current_database()").fetchone()[0]
        conn.execute("SELECT pg_create_logical_replication_slot('flinkish_mirror', 'pgoutput')")
        Ownership(database, "flinkish_mirror", "flinkish_mirror", True, False).write(FileIO.for_url(str(meta)),
                                                                                      str(directory))
        try:
            assert ended_before(config) is None  # the final notification (slot drop) is still due: Spark delivers it
        finally:
            conn.execute("SELECT pg_drop_replication_slot('flinkish_mirror')")
    text = ended_before(config)
    assert text is not None and "this mirror was drained before" in text
    spark_log(spark_cp, 0, finished(meta, 0, stop=None))  # ended by itself: --stop-after-snapshot
    assert "every table was copied before" in (ended_before(config) or "")
