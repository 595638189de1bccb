"""``tables = 'public.m_*'`` mirrored into one Iceberg table per source table (``table = mirror.{schema}_{table}``)
through kill -9, schema changes, a new and a dropped table, and a drain.

The workload of tests/connectors/delta/test_routed_mirror.py (flinkish_spark.testing.mirror: a writer
changing every table; after two epochs ``ADD COLUMN`` on m_a, ``numeric(12,2) -> numeric(14,2)`` on
m_c, a new table m_new, ``DROP TABLE m_drop``), into the routed ``flinkish.iceberg`` sink (a SQL
catalog on SQLite, tables on local disk): after the kills and the drain every Iceberg target read by
pyiceberg equals its source table (new column and new table included), no table outside the pattern
has a target, and no slot or publication is left. m_a keeps soft deletes and m_b its history
(``tableModes``): what they hold now equals their table, m_b's versions never overlap or repeat; m_b's history
tracks only j (``trackHistoryColumns``): its versions are the ones the writer's changes make of it
(``tracked_history_problems``: a version per change of j, every later change of only nn updating it in place). m_a's
target is partitioned (a rule's ``partitionBy``, identity) by a computed column the writer's updates change (keys move
between its partitions): its spec names it, its files hold its three values. Three tables
have the Delta test's transforms: each target equals what its rule makes of its table. The shards m_c, m_drop and
m_new are merged into one target ``mirror.merged_m`` (``routes``, issue 30 item 3; keyed by ``id`` and
``_source_table``): each shard equals its rows of it (``flinkish mirror compare``'s reader), the dropped shard's rows
stay, m_new's column is null in the other shards' rows, m_c's widened column is promoted in the merged target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import psycopg
import pytest

import pyarrow as pa
import pyarrow.compute as pc

from flinkish_spark.connectors.lakehouse.table_modes import parse_table_modes
from flinkish_spark.connectors.lakehouse.transform.rules import parse_transforms
from flinkish_spark.mirror.compare import iceberg_reader
from flinkish_spark.testing.mirror import (
    PARTITIONED_M_A, TRACKED_M_B, WORKLOAD_TRANSFORMS, history_problems, run_workload, slots_and_publications,
    table_states, target_differences, tracked_history_problems,
)

pyiceberg = pytest.importorskip("pyiceberg")
pytestmark = pytest.mark.slow

KILLS = 1  # a random one; the routed commit's own points: test_routed_crash.py (docs/testing.md)
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))
#: m_a keeps soft deletes (partitioned by its computed vlen), m_b its history (tracking j only); the others mirrored.
MODES = json.dumps([PARTITIONED_M_A, TRACKED_M_B])
TRANSFORMS = WORKLOAD_TRANSFORMS  # columns and rows chosen (issue 30 item 2)
#: The shards merged (all three mirrored with hard deletes), as in the Delta test.
ROUTES = json.dumps([{"source-table": "public.m_c, public.m_drop, public.m_new", "sink-table": "mirror.merged_m"}])


def spec(tmp_path: Path, url: str, **extra: object) -> dict:
    return {
        "source": {"format": "flinkish.postgres", "options": {
            "uid": "mirror", "checkpoint": str(tmp_path / "meta"), "url": url, "tables": "public.m_*",
            "splitSize": 500, "maxRowsPerTrigger": 2000, "discoveryInterval": 1}},
        "sink": {"format": "flinkish.iceberg", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "lake", "checkpoint": str(tmp_path / "meta"), "table": "mirror.{schema}_{table}",
            "catalogUri": f"sqlite:///{tmp_path}/catalog.db", "warehouse": f"file://{tmp_path}/wh",
            "compactEvery": 3,  # each target's files with deletes rewritten every 3 of its snapshots, through the kills
            "tableModes": MODES, "transforms": TRANSFORMS, "routes": ROUTES}},
        "trigger": "1 second",
        "end": "timeout",
        "runSeconds": 200,
        **extra,
    }


def test_pattern_mirror_into_routed_iceberg_through_kills_schema_changes_and_new_tables(pg_url, run_pipeline,
                                                                                        tmp_path: Path) -> None:
    from pyiceberg.catalog.sql import SqlCatalog

    run_workload(run_pipeline, lambda **extra: spec(tmp_path, pg_url, **extra), pg_url, str(tmp_path / "cp"),
                 str(tmp_path), KILLS, SEED)

    catalog = SqlCatalog("flinkish", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/wh")
    read: Callable[[str], Any] = iceberg_reader("mirror.{schema}_{table}", {"catalogUri": f"sqlite:///{tmp_path}/catalog.db",
                                                       "warehouse": f"file://{tmp_path}/wh", "routes": ROUTES},
                          str(tmp_path / "meta"))  # a shard: its rows of the merged target

    tables = ["public.m_a", "public.m_b", "public.m_c", "public.m_new"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        source, schemas = table_states(conn, tables)
    assert "extra" in schemas["public.m_a"].names
    assert target_differences(read, source, schemas, parse_table_modes({"tableModes": MODES}.get, "test"),
                              parse_transforms({"transforms": TRANSFORMS}.get, "test")) == {}
    m_a, m_new = read("public.m_a"), read("public.m_new")
    assert "b" not in m_a.column_names and "extra" not in m_a.column_names  # excluded, also once the source added it
    assert 0 < m_new.num_rows < len(source["public.m_new"]) and "iv" not in m_new.column_names  # the filter's rows
    versions = read("public.m_b")
    assert history_problems(versions, ["k"], ["j"]) == [] and versions.num_rows > len(source["public.m_b"])
    assert tracked_history_problems(versions) == []  # the versions the writer's changes make, in place ones too
    m_a_table = catalog.load_table("mirror.public_m_a")  # equal to its table (above), partitioned
    assert [(m_a_table.schema().find_column_name(f.source_id), str(f.transform)) for f in m_a_table.spec().fields] == [
        ("vlen", "identity")]
    assert {"short", "mid", "long"} <= {p["vlen"] for p in m_a_table.inspect.files()["partition"].to_pylist()}
    assert pc.sum(read("public.m_a")["_deleted"]).as_py() > 0  # the deleted keys kept
    assert sorted(n for _, n in catalog.list_tables("mirror")) == ["merged_m", "public_m_a",
                                                                  "public_m_b"]  # never 'other'
    merged = catalog.load_table("mirror.merged_m").scan().to_arrow()
    shards = merged["_source_table"].cast(pa.string()).to_pylist()
    u = [v for v, t in zip(merged["u"].to_pylist(), shards) if t == "public.m_drop"]
    assert len(u) > 50 and u == [None] * len(u)  # the dropped shard's rows stay; m_new's column null in them
    amount = catalog.load_table("mirror.merged_m").schema().find_field("amount")
    assert str(amount.field_type) == "decimal(14, 2)"  # promoted by the shard m_c
    assert any(s.summary is not None and s.summary.additional_properties.get("flinkish.compaction") == "true"
               for s in catalog.load_table("mirror.merged_m").snapshots())  # compacted, each shard equal to its source
    assert slots_and_publications(pg_url) == (0, [])
