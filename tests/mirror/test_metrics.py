"""``flinkish mirror --metrics-port`` and ``flinkish mirror status`` end to end, on the embedded PostgreSQL.

One mirror (two tables into local Delta tables), whose first run is killed (``kill -9`` of the driver, the
crash point ``mirror.before_status_record``) after epochs were committed and before their counts were
recorded; the same command started again counts them once. Its endpoint is scraped while the snapshot runs --
at least once while Spark runs a batch (planned in its offset log, not committed before nor after
the scrape) -- and after a writer changed both tables: per table the rows snapshotted equal the
table's rows before, the changes applied equal what the writer did, the states are ``streaming``;
the slot's retained WAL equals ``pg_current_wal_lsn() - restart_lsn`` within 1 MiB, the last
committed epoch is the sink's in the metadata. Drained, ``flinkish mirror status --json`` on the
stopped mirror gives the same per-table counts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.spark_log import committed_batches
from tests.mirror.test_pipeline import ended, flinkish, start, wait_for

pytest.importorskip("deltalake")
prometheus_parser = pytest.importorskip("prometheus_client.parser")
pytestmark = pytest.mark.slow

SETUP = """
CREATE TABLE q_a (id int PRIMARY KEY, v text);
CREATE TABLE q_b (id int PRIMARY KEY, v text);
INSERT INTO q_a SELECT g, 'a' || g FROM generate_series(1, 6000) g;
INSERT INTO q_b SELECT g, 'b' || g FROM generate_series(1, 2500) g;
"""
SNAPSHOT = {"public.q_a": 6000, "public.q_b": 2500}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The endpoint's samples: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in prometheus_parser.text_string_to_metric_families(text) for s in f.samples}


def per_table(samples: dict, name: str) -> dict[str, float]:
    return {dict(labels)["table"]: v for (n, labels), v in samples.items() if n == name}


def planned(spark_cp: Path) -> list[int]:
    folder = spark_cp / "offsets"
    return sorted(int(n) for n in (p.name for p in folder.iterdir()) if n.isdigit()) if folder.is_dir() else []


def test_metrics_while_it_runs_and_status_when_stopped(pg_url: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)
    port, meta, spark_cp = free_port(), tmp_path / "meta", tmp_path / "meta" / "spark"
    cmd = [*flinkish(), "mirror", "--from", pg_url, "--tables", "public.q_*", "--to", str(tmp_path / "lake"),
           "--checkpoint", str(meta), "--trigger", "1s", "--source-option", "splitSize=500",
           "--source-option", "maxRowsPerTrigger=1000", "--metrics-port", str(port)]
    # The first run is killed at its second record of counts: epochs of the snapshot are committed (visible in
    # the targets), their counts not recorded. The per-table counts below must hold them once all the same.
    log = tmp_path / "killed.log"
    rc, out = ended(start(cmd, log, env={**os.environ, "FLINKISH_CRASH_AT": "mirror.before_status_record:2",
                                         "FLINKISH_CRASH_DIR": str(tmp_path)}), log)
    assert rc == 137 and "run the same command again" in out, out[-4000:]
    log = tmp_path / "run.log"
    proc = start(cmd, log)  # the same command
    try:
        # Scraped while a batch runs: the same batch planned and not committed before and after the scrape.
        during_batch = 0
        deadline = time.time() + 300
        while during_batch < 1:
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-4000:]
            before = (planned(spark_cp)[-1:], committed_batches(spark_cp)[-1:])
            took = time.monotonic()
            try:
                samples = scrape(port)
                took = time.monotonic() - took
            except OSError:
                time.sleep(0.2)  # not serving yet (Spark starts first)
                continue
            after = (planned(spark_cp)[-1:], committed_batches(spark_cp)[-1:])
            running = before[0] and before == after and before[0] != before[1]
            if running and ("flinkish_mirror_rows_total", ()) in samples:
                during_batch += 1
                assert took < 2, f"a scrape during batch {before[0]} took {took:.1f}s"
                print(f"scraped during batch {before[0]} in {took * 1000:.0f} ms")
        # The writer: changes in both tables once the snapshot is read.
        wait_for("both tables streaming", lambda: per_table(scrape(port), "flinkish_mirror_table_state") and all(
            v == 1 for (n, labels), v in scrape(port).items()
            if n == "flinkish_mirror_table_state" and dict(labels)["state"] == "streaming")
            and len(per_table(scrape(port), "flinkish_mirror_table_snapshot_rows_total")) == 2, proc, log)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for i in range(20):  # 20 transactions: several epochs
                conn.execute("INSERT INTO q_a SELECT g, 'n' FROM generate_series(%s::int, %s::int) g", (10_000 + i * 10, 10_009 + i * 10))
                conn.execute("UPDATE q_b SET v = v || 'u' WHERE id BETWEEN %s AND %s", (i * 5 + 1, i * 5 + 5))
                time.sleep(0.1)
            conn.execute("DELETE FROM q_a WHERE id <= 30")
        expected_changes = {"public.q_a": 200 + 30, "public.q_b": 100}
        wait_for("the changes counted", lambda: per_table(scrape(port), "flinkish_mirror_table_changes_total")
                 == expected_changes, proc, log, timeout=120)

        samples = scrape(port)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            retained = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint FROM "
                                    "pg_replication_slots WHERE slot_name = 'flinkish_mirror'").fetchone()[0]
            rows = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in SNAPSHOT}
        assert per_table(samples, "flinkish_mirror_table_snapshot_rows_total") == SNAPSHOT
        assert {t: SNAPSHOT[t] + (200 - 30 if t == "public.q_a" else 0) for t in SNAPSHOT} == rows
        slot = samples[("flinkish_mirror_slot_retained_wal_bytes", (("slot", "flinkish_mirror"),))]
        assert abs(slot - retained) <= 2**20, (slot, retained)
        print(f"slot retains {retained} B (scraped {slot:.0f}); lag {samples[('flinkish_mirror_lag_seconds', ())]:.2f}s")
        assert samples[("flinkish_mirror_slot_confirmed_lag_bytes", (("slot", "flinkish_mirror"),))] >= 0
        assert samples[("flinkish_mirror_rows_total", ())] == sum(SNAPSHOT.values()) + 330
        assert 0 <= samples[("flinkish_mirror_lag_seconds", ())] < 60
        assert samples[("flinkish_mirror_running", ())] == 1
        assert samples[("flinkish_mirror_restarts_total", ())] == 1 and samples[("flinkish_mirror_errors_total", ())] == 0
        assert samples[("flinkish_mirror_epoch_duration_seconds_count", (("phase", "batch"),))] >= 5
        from flinkish_spark.inspect import sink_epochs
        from flinkish_spark.io.fileio import FileIO

        epoch = samples[("flinkish_mirror_last_committed_epoch", ())]
        sink = [e.epoch for e in sink_epochs(FileIO.for_url(str(meta)), str(meta), last=50) if e.state == "committed"]
        assert epoch in sink, (epoch, sink)
        # per table: its lag and its newest epoch with rows (both tables changed in the last epochs with changes)
        lags = per_table(samples, "flinkish_mirror_table_lag_seconds")
        assert lags.keys() == set(SNAPSHOT) and all(0 <= v < 60 for v in lags.values()), lags
        assert max(lags.values()) >= samples[("flinkish_mirror_lag_seconds", ())]  # the mirror-wide: the newest change
        assert all(e <= epoch for e in per_table(samples, "flinkish_mirror_table_last_committed_epoch").values())

        proc.send_signal(signal.SIGTERM)
        rc, out = ended(proc, log)
        assert rc == 0 and "drained" in out, out[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    status = subprocess.run([*flinkish(), "mirror", "status", "--checkpoint", str(meta), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    got = json.loads(status.stdout)
    assert {t["name"]: (t["snapshot_rows"], t["changes"]) for t in got["tables"]} == {
        t: (SNAPSHOT[t], expected_changes[t]) for t in SNAPSHOT}
    assert all(t["lag_s"] is not None and t["last_epoch"] is not None for t in got["tables"]) and got["counts_exact"]
    assert got["runs"] == 2 and got["errors"] == 0 and got["last_epoch"] >= epoch
