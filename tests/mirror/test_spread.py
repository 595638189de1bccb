"""``flinkish mirror --parallelism 2``: an epoch's per-table work in two sink tasks (the changes spread by table),
killed with SIGKILL between two tasks' prepares and in the middle of a commit, restarted with the same command.

The writer changes m_a, m_b, m_c all the time and, once two epochs are committed, adds a column, widens one,
creates a table and drops one (flinkish_spark.testing.mirror's workload): the schema rows must travel with their
table's changes into its task. Run 1 is killed (``FLINKISH_CRASH_AT=sink.after_prepare``) when a sink task has
written its files -- the epoch's other task not necessarily; run 2 when the first table of an epoch has its Delta
version and the others not (``sink.between_tables``); run 3 in the driver, while it reads an epoch's change range
to hand it to the two tasks (``source.spread_read``: the source's ``spreadChanges``, which the command sets); run 4
drains. Every target then equals its table, and the sink's decision records show epochs whose changed tables came
from two tasks.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.connectors.delta.routed import decode_routed
from flinkish_spark.sink.decisions import decode_decision
from flinkish_spark.testing.mirror import delta_differences, slots_and_publications, table_states
from flinkish_spark.testing.mirror_process import drain, ended, flinkish, start, wait_for, writer_running
from flinkish_spark.testing.spark_log import committed_batches

pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

TABLES = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]


def change_tasks_per_epoch(meta: Path) -> list[int]:
    """Per decided epoch still on disk: how many sink tasks held change rows (a part with an LSN)."""
    out = []
    for path in sorted(glob.glob(str(meta / "sinks" / "mirror_sink" / "decisions" / "*.parquet"))):
        decision = decode_decision(open(path, "rb").read(), path)
        tasks = [decode_routed(c) for c in decision.committables]
        out.append(sum(1 for c in tasks if any(p.lsn >= 0 for p in c.parts)))
    return out


def test_two_tasks_killed_between_prepares_and_mid_commit_then_the_targets_equal_the_tables(
        pg_url: str, tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    spark_cp = str(meta / "spark")
    cmd = [*flinkish(), "mirror", "--from", pg_url, "--tables", "public.m_*", "--to", str(tmp_path / "lake"),
           "--checkpoint", str(meta), "--trigger", "1s", "--parallelism", "2", "--source-option", "splitSize=500",
           "--source-option", "maxRowsPerTrigger=2000", "--source-option", "discoveryInterval=1"]
    with writer_running(pg_url, tmp_path, ddl_after=os.path.join(spark_cp, "commits")) as stop_writer:
        for run, point in (("run1", "sink.after_prepare:9"), ("run2", "sink.between_tables:3"),
                           ("run3", "source.spread_read:2")):
            (tmp_path / run).mkdir()
            log = tmp_path / f"{run}.log"
            rc, out = ended(start(cmd, log, env={"FLINKISH_CRASH_AT": point, "FLINKISH_CRASH_DIR": str(tmp_path / run)}),
                            log)
            assert rc == 137 and "run the same command again" in out, out[-4000:]
        log = tmp_path / "run4.log"
        last = start(cmd, log)
        before = len(committed_batches(spark_cp))
        # the schema changes and the new table come 2 s apart once two epochs are committed: give them time
        wait_for("6 more epochs", lambda: len(committed_batches(spark_cp)) >= before + 6, last, log)
        stop_writer()
        drain(last, log)

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, TABLES)
    assert "extra" in schemas["public.m_a"].names
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    assert sorted(os.listdir(tmp_path / "lake" / "public")) == ["m_a", "m_b", "m_c", "m_drop", "m_new"]
    assert slots_and_publications(pg_url) == (0, [])
    assert max(change_tasks_per_epoch(meta)) == 2  # the changes of an epoch were prepared in two tasks
