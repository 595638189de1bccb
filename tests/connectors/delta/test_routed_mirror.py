"""``tables = 'public.m_*'`` mirrored into one Delta table per source table on S3 (moto:
``path = s3://test/lake/{schema}/{table}``, the metadata checkpoint on S3 too) through kill -9,
schema changes, a new and a dropped table, and a drain, with ``compactEvery=3``.

The workload of tests/connectors/postgres/test_source_tables_mirror.py (flinkish_spark.testing.mirror:
a writer changing every table; after two epochs ``ADD COLUMN`` on m_a, ``numeric(12,2) ->
numeric(14,2)`` on m_c, a new table m_new, ``DROP TABLE m_drop``), but into the routed
``flinkish.delta`` sink: after the kills and the drain every Delta target read by delta-rs
equals its source table (new column and new table included), no table outside the pattern
has a target, and no slot or publication is left. m_a keeps soft deletes and m_b its history
(``tableModes``): what they hold now equals their table, m_b's versions never overlap or repeat, also
through the compactions. m_b's history tracks only j (``trackHistoryColumns``): its versions are the ones the
writer's changes make of it (``tracked_history_problems``: a version per change of j, every later change of only nn
updating it in place). m_a's target is partitioned (a rule's ``partitionBy``) by a computed column the writer's
updates change (keys move between its partitions): the log names it, its files hold its three values. Three tables have transforms (``transforms``): excluded columns (one the writer adds
later), row filters rows enter and leave, computed columns -- each target equals what its rule makes of its table.

Two route rules (``routes``, issue 30 item 3): the shards m_c, m_drop and m_new merged into one target ``lake/merged/m``
(keyed by ``id`` and ``_source_table``; each shard's transform its own), m_b to a template of its own
(``lake/history/{table}``). Each shard equals its rows of the merged target (``flinkish mirror compare``'s view), the
dropped shard's rows stay there, m_new's column is null in the other shards' rows, and m_c's widened column is widened
in the merged target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flinkish_spark.mirror.compare import delta_reader, delta_storage
from flinkish_spark.testing.mirror import (
    PARTITIONED_M_A, TRACKED_M_B, WORKLOAD_TRANSFORMS, delta_differences, history_problems, run_workload,
    slots_and_publications, table_states, tracked_history_problems,
)

deltalake = pytest.importorskip("deltalake")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

KILLS = 1  # a random one; the routed commit's own points: test_routed_crash.py (docs/testing.md)
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))
LAKE = "s3://test/lake"
META = "s3://test/meta"
#: m_a: soft deletes, partitioned by its computed vlen; m_b: history tracking j only (issue 30).
MODES = json.dumps([PARTITIONED_M_A, TRACKED_M_B])
TRANSFORMS = WORKLOAD_TRANSFORMS  # excluded columns (one added later), filters crossed both ways, computed
#: Merged shards (all three mirrored with hard deletes; history by shard: test_routed_shards.py) and a rule
#: of its own for m_b: no Spark start of their own (they had tests/mirror/test_merged_shards.py).
ROUTES = json.dumps([{"source-table": "public.m_c, public.m_drop, public.m_new", "sink-table": "merged/m"},
                     {"source-table": "public.m_b", "sink-table": "history/{table}"}])


def spec(tmp_path: Path, url: str, endpoint: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": META, "endpointUrl": endpoint, "url": url, "tables": "public.m_*",
            "splitSize": 500, "maxRowsPerTrigger": 2000, "discoveryInterval": 1,
            "rowFormat": "arrow",  # the shape flinkish mirror reads to a lakehouse
            "transforms": TRANSFORMS}},  # as flinkish mirror derives it: the columns left out are never read
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": META, "endpointUrl": endpoint, "path": LAKE + "/{schema}/{table}",
            "compactEvery": 3,  # each target compacted every 3 of its versions, through the kills too
            "tableModes": MODES, "transforms": TRANSFORMS, "routes": ROUTES}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_pattern_mirror_into_routed_delta_through_kills_schema_changes_and_new_tables(pg_url, run_pipeline, s3_proc: str,
                                                                                      tmp_path: Path) -> None:
    import s3fs

    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, s3_proc, **extra), pg_url, str(tmp_path / "cp"),
                 str(tmp_path), KILLS, SEED)

    tables = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    assert "extra" in schemas["public.m_a"].names
    options = {"endpointUrl": s3_proc, "tableModes": MODES, "transforms": TRANSFORMS, "routes": ROUTES}
    assert delta_differences(LAKE, source, schemas, options) == {}  # each shard: its rows of the merged target
    storage = delta_storage(LAKE, {"endpointUrl": s3_proc})
    m_b = deltalake.DeltaTable(LAKE + "/history/m_b", storage_options=storage)
    versions = pa.table(m_b.scan())
    assert history_problems(versions, ["k"], ["j"]) == [] and versions.num_rows > len(source["public.m_b"])
    assert tracked_history_problems(versions) == []  # the versions the writer's changes make, in place ones too
    m_a_table = deltalake.DeltaTable(LAKE + "/public/m_a", storage_options=storage)
    assert m_a_table.metadata().partition_columns == ["vlen"]  # equal to its table (above), partitioned
    files = pa.table(m_a_table.get_add_actions(flatten=True))
    assert {"short", "mid", "long"} <= set(files["partition.vlen"].to_pylist())
    m_a = pa.table(m_a_table.scan())
    assert pc.sum(m_a["_deleted"]).as_py() > 0  # the deleted keys kept
    assert "b" not in m_a.column_names and "extra" not in m_a.column_names  # excluded, also once the source added it
    m_new = delta_reader(LAKE, options)("public.m_new")  # the shard's rows of the merged target
    assert m_new is not None and 0 < m_new.num_rows < len(source["public.m_new"]) and "iv" not in m_new.column_names  # the filter's rows
    fs = s3fs.S3FileSystem(endpoint_url=s3_proc)
    names = lambda folder: sorted(p.rsplit("/", 1)[-1] for p in fs.ls(folder, refresh=True))  # noqa: E731
    assert names("test/lake") == ["history", "merged", "public"]  # never 'other'
    assert names("test/lake/public") == ["m_a"]  # m_b by its own rule, the shards merged

    merged_table = deltalake.DeltaTable(LAKE + "/merged/m", storage_options=storage)
    merged = pa.table(merged_table.scan())
    shards = merged["_source_table"].cast(pa.string()).to_pylist()
    # The dropped shard's rows stay, as a dropped table's target does: every key of it ever written is live (through
    # the compactions too). Not always all 100: the writer may drop m_drop before its snapshot chunks are all read --
    # the source then ends its snapshot there, as for any table dropped during its snapshot.
    written = set()
    for f in fs.glob("test/lake/merged/m/**/*.parquet"):
        if "_delta_log" in f or not {"id", "_source_table"} <= set(pq.read_schema(f, filesystem=fs).names):
            continue  # the log's checkpoints
        rows = pq.read_table(f, columns=["id", "_source_table"], filesystem=fs).to_pylist()
        written |= {r["id"] for r in rows if r["_source_table"] == "public.m_drop"}
    dropped = {i for i, t in zip(merged["id"].to_pylist(), shards) if t == "public.m_drop"}
    assert dropped == written and len(dropped) > 50, (sorted(written - dropped), len(dropped))
    u = [v for v, t in zip(merged["u"].to_pylist(), shards) if t == "public.m_drop"]
    assert u and u == [None] * len(u)  # m_new's column, null in the other shards' rows
    amount = {f.name: f for f in merged_table.schema().fields}["amount"]
    assert str(amount.type) == 'PrimitiveType("decimal(14,2)")'  # widened by the shard m_c
    assert any(h["operation"] == "OPTIMIZE" for h in merged_table.history())  # compacted, each shard still equal
    assert slots_and_publications(pg_url) == (0, [])
