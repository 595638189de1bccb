"""One big transaction through the mirror path (issue 26, target 4), exactly once under kill -9 during its epoch.

The transaction (an UPDATE of every row, deletes and inserts: 200k+ changes) is one epoch: the source reads its
range in pieces (``changes.PEEK_PIECE`` messages) and yields 65k-row batches as it goes, the sink task decodes them
``routing.DECODE_ROWS`` at a time -- the code path of a transaction of millions of rows, whose memory
``benchmarks/big_transaction.py`` measures. The driver is killed in the middle of the source's read of the range,
and once more after the decision of the epoch is recorded (which names the sink task's key entries file, see
``connectors.lakehouse.entries_file``: the restart's commit reads it); a last run drains: the target equals the table, and the
epoch is in one Delta version.
"""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import psycopg
import pytest

from flinkish_spark.testing.mirror import delta_differences, table_states

pytestmark = pytest.mark.slow

ROWS = 200_000
SETUP = f"""
CREATE TABLE big (id bigint PRIMARY KEY, v int NOT NULL, s text, ts timestamp);
INSERT INTO big SELECT g, g % 1000, md5(g::text) || 'abcdefgh', timestamp '2024-01-01' + g * interval '1 second'
  FROM generate_series(1, {ROWS}) g;
"""
BIG_TRANSACTION = f"""
BEGIN;
UPDATE big SET v = v + 1;
DELETE FROM big WHERE id % 1000 = 0;
INSERT INTO big SELECT g, -1, 'new', NULL FROM generate_series({ROWS} + 1, {ROWS} + 5000) g;
UPDATE big SET s = 'twice' WHERE id % 777 = 0;
COMMIT;
"""


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.big",
            "splitSize": 100_000, "maxRowsPerTrigger": 200_000,
            "rowFormat": "arrow", "decodeIn": "sink"}},  # the shape flinkish mirror reads to a lakehouse
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": str(tmp_path / "meta"), "path": str(tmp_path / "lake" / "{schema}" / "{table}")}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 240,
        **extra,
    }


def test_a_transaction_of_200k_changes_is_mirrored_exactly_once_through_kills_during_its_epoch(
        pg_url, run_pipeline, tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta.table import deltalake

    target = tmp_path / "lake" / "public" / "big"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(SETUP)

    def snapshot_mirrored() -> bool:
        if not glob.glob(str(target / "_delta_log" / "*.json")):
            return False
        actions = deltalake().DeltaTable(str(target)).get_add_actions(flatten=True)  # no deletion vectors yet
        return sum(n or 0 for n in actions.column("num_records").to_pylist()) == ROWS

    first = run_pipeline(spec(tmp_path, pg_url), kill_after=0.0, kill_when=snapshot_mirrored)
    assert first.killed, first.output[-3000:]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(BIG_TRANSACTION)

    # In the source's read of the range: its third batch of 65,536 rows produced, the sink task still taking them.
    mid_read = run_pipeline(spec(tmp_path, pg_url), crash_at="source.read:3")
    assert mid_read.killed, mid_read.output[-3000:]
    # Every task prepared, the decision of the epoch recorded, the Delta version not yet written.
    decided = run_pipeline(spec(tmp_path, pg_url), crash_at="sink.after_decision")
    assert decided.killed, decided.output[-3000:]
    # The task's key entries (200k+ keys) are in a file beside its data files: the decision record names it
    # (a few hundred bytes, not megabytes of keys), and the restart's commit reads that same file.
    key_files = glob.glob(str(target / "flinkish" / "lake" / "e*" / "*.entries.arrow"))
    records = glob.glob(str(tmp_path / "meta" / "**" / "sinks" / "lake" / "decisions" / "*.parquet"), recursive=True)
    assert key_files and records and max(os.path.getsize(r) for r in records) < 64 * 1024, (key_files, records)
    last = run_pipeline(spec(tmp_path, pg_url, end="drain", stopAfterBatches=1))
    assert last.returncode == 0 and "QUERY_END=drained" in last.output, last.output[-3000:]

    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, ["public.big"])
    assert len(source["public.big"]) == ROWS - ROWS // 1000 + 5000
    assert delta_differences(str(tmp_path / "lake"), source, schemas) == {}
    # Each epoch in one version of the table: the big transaction's epoch was committed once.
    epochs = []
    for path in sorted(glob.glob(str(target / "_delta_log" / "*.json"))):
        for line in open(path):
            action = json.loads(line)
            if "txn" in action and action["txn"]["appId"] == "lake":
                epochs.append(action["txn"]["version"])
    assert len(epochs) == len(set(epochs)) and epochs == sorted(epochs), epochs
    assert os.path.exists(target)
    # Done epochs' key files are cleaned up with the other files of the epoch no commit will read again.
    assert glob.glob(str(target / "flinkish" / "lake" / "e*" / "*.entries.arrow")) == []
