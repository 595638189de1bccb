"""Driving a multi-table ``flinkish.postgres`` source (option ``tables``) without Spark: its enumerator and reader
on a real server, epoch by epoch, as the tests of tests/connectors/postgres/test_source_tables*.py do."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pyarrow as pa

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.connectors.postgres.source import PostgresSourceDataSource
from flinkish_spark.connectors.postgres.source.tables_enumerator import TablesEnumerator
from flinkish_spark.source.split import Split


def source(url: str, tmp_path: Path, **options: str) -> PostgresSourceDataSource:
    opts = {"uid": "multi", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "splitSize": "10", "discoveryInterval": "0.001", **options}
    src = PostgresSourceDataSource(opts)
    src.setup_source()
    return src


def read_all(src: PostgresSourceDataSource, splits: list[Split]) -> pa.Table:
    reader = src.create_reader(None)  # type: ignore[arg-type]
    batches = [b for s in splits for b in reader.read(s, 0, 1)]
    return pa.Table.from_batches(batches) if batches else pa.table({})


def without_markers(rows: pa.Table) -> pa.Table:
    """``rows`` without a re-snapshot's ``B``/``E`` marker rows (for split_tables, which reads them as data)."""
    return rows.filter(pa.compute.invert(pa.compute.is_in(rows["_op"], pa.array(["B", "E"]))))


def complete(src: PostgresSourceDataSource, enum: TablesEnumerator, ckpt_id: int, finished: list[Split],
             live: tuple[SplitRecord, ...] = ()) -> None:
    """The enumerator's 'checkpoint complete' for an epoch that read ``finished`` (whole) and holds ``live``."""
    records = tuple(SplitRecord(s.split_id, 0, 1, 1, True, ckpt_id) for s in finished) + live
    enum.on_checkpoint_complete(SourceCheckpoint("multi", src.name(), ckpt_id, None, 0, "{}", enum.snapshot_state(),
                                                 False, records))


def changes_between(src: PostgresSourceDataSource, enum: TablesEnumerator, changes: Split, start: int) -> tuple[pa.Table, int]:
    end = enum.extent(changes, start).available
    batches = list(src.create_reader(None).read(changes, start, end))  # type: ignore[arg-type]
    return (pa.Table.from_batches(batches) if batches else pa.table({})), end


def server_objects(conn: psycopg.Connection) -> tuple[int, list[tuple[str, set[str]]]]:
    row = conn.execute("SELECT count(*) FROM pg_replication_slots WHERE database = current_database()").fetchone()
    slots = int(row[0]) if row else 0
    pubs = conn.execute("SELECT pubname FROM pg_publication").fetchall()
    out = []
    for (name,) in pubs:
        tables = conn.execute("SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = %s", (name,))
        out.append((name, {r[0] for r in tables.fetchall()}))
    return slots, out


def drop_slot(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'flinkish_multi'")


def start_streaming(src: PostgresSourceDataSource) -> tuple[TablesEnumerator, Split]:
    """Snapshot chunks planned, read and completed; returns the enumerator and its change split."""
    enum = src.create_enumerator()
    assert isinstance(enum, TablesEnumerator)
    chunks = enum.discover(set())
    complete(src, enum, 1, chunks)
    (changes,) = [s for s in enum.discover({s.split_id for s in chunks}) if s.split_id.startswith("changes-")]
    return enum, changes
