"""Route rules and merged shards end to end, in Spark: ``tables = 'public.m_*'`` into routed Delta with two rules --
``public.m_c, public.m_drop, public.m_new`` merged into one target ``lake/merged/m`` (keyed by ``id`` and
``_source_table``), ``public.m_b`` to a template of its own (``lake/other/{table}``) -- through the writer of
flinkish_spark.testing.mirror (every table changed concurrently; after two epochs ``ADD COLUMN`` on m_a,
``numeric(12,2) -> numeric(14,2)`` on the shard m_c, the new shard m_new appearing, the shard m_drop dropped), a
kill -9 inside the commit between two targets (the merged target's version not written yet), and a drain.

Afterwards every source table equals what its target holds of it (``flinkish mirror compare``'s view: a shard's rows of
the merged target, reference rows read from the server), the dropped shard's rows are still in the merged target, m_new's
columns are null in the other shards' rows, and m_c's widened column is widened in the merged target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flinkish_spark.testing.mirror import delta_differences, run_workload, slots_and_publications, table_states

deltalake = pytest.importorskip("deltalake")
pytestmark = pytest.mark.slow

SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))  # no random kill: the crash point is the kill here
ROUTES = json.dumps([{"source-table": "public.m_c, public.m_drop, public.m_new", "sink-table": "merged/m"},
                     {"source-table": "public.m_b", "sink-table": "other/{table}"}])


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    meta = str(tmp_path / "meta")
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": meta, "url": url, "tables": "public.m_*", "splitSize": 500,
            "maxRowsPerTrigger": 2000, "discoveryInterval": 1, "rowFormat": "arrow"}},
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": meta, "path": str(tmp_path / "lake" / "{schema}" / "{table}"),
            "routes": ROUTES}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_merged_shards_and_route_rules_through_a_writer_kills_schema_changes_and_a_dropped_shard(
        pg_url, run_pipeline, tmp_path: Path) -> None:
    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, **extra), pg_url, str(tmp_path / "cp"),
                 str(tmp_path), 0, SEED, crash_at="sink.between_tables:3")  # kill -9 mid-commit: one run fewer

    tables = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    lake = tmp_path / "lake"
    assert delta_differences(str(lake), source, schemas, {"routes": ROUTES}) == {}
    assert sorted(os.listdir(lake)) == ["merged", "other", "public"]
    assert sorted(os.listdir(lake / "public")) == ["m_a"]  # m_b by its own rule, the shards merged
    merged = pa.table(deltalake.DeltaTable(str(lake / "merged" / "m")).scan())
    merged = merged.set_column(merged.schema.get_field_index("_source_table"), "_source_table",
                               merged["_source_table"].cast(pa.string()))
    shards = merged["_source_table"].to_pylist()
    by_shard = {t: shards.count(t) for t in set(shards)}
    # The dropped shard's rows stay, as a dropped table's target does: every key of it ever written is live. (Not
    # always all 100: the writer may drop m_drop before its snapshot chunks are all read -- the source then ends its
    # snapshot there, as for any table dropped during its snapshot.)
    written = set()
    for f in (lake / "merged" / "m").rglob("*.parquet"):
        if "_delta_log" in f.parts or not {"id", "_source_table"} <= set(pq.read_schema(f).names):
            continue  # the log's checkpoints
        rows = pq.read_table(f, columns=["id", "_source_table"]).to_pylist()
        written |= {r["id"] for r in rows if r["_source_table"] == "public.m_drop"}
    dropped = {i for i, t in zip(merged["id"].to_pylist(), shards) if t == "public.m_drop"}
    assert dropped == written and len(dropped) > 50, (sorted(written - dropped), len(dropped))
    assert by_shard["public.m_c"] == len(source["public.m_c"]) and by_shard["public.m_new"] == len(source["public.m_new"])
    u = [v for v, t in zip(merged["u"].to_pylist(), shards) if t == "public.m_drop"]
    assert u and u == [None] * len(u)  # m_new's column, null in the other shards' rows
    amount = {f.name: f for f in deltalake.DeltaTable(str(lake / "merged" / "m")).schema().fields}["amount"]
    assert str(amount.type) == 'PrimitiveType("decimal(14,2)")'  # widened by the shard m_c
    assert slots_and_publications(pg_url) == (0, [])
