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
through the compactions. Three tables have transforms (``transforms``): excluded columns (one the writer adds
later), row filters rows enter and leave, computed columns -- each target equals what its rule makes of its table.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from flinkish_spark.mirror.compare import delta_storage
from flinkish_spark.testing.mirror import (
    WORKLOAD_TRANSFORMS, delta_differences, history_problems, run_workload, slots_and_publications, table_states,
)

deltalake = pytest.importorskip("deltalake")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

KILLS = 1  # a random one; the routed commit's own points: test_routed_crash.py (docs/testing.md)
SEED = int(os.environ.get("FLINKISH_TEST_SEED", "18"))
LAKE = "s3://test/lake"
META = "s3://test/meta"
MODES = '[{"tables": "public.m_a", "deletes": "soft"}, {"tables": "public.m_b", "mode": "history"}]'
TRANSFORMS = WORKLOAD_TRANSFORMS  # excluded columns (one added later), filters crossed both ways, computed


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
            "tableModes": MODES, "transforms": TRANSFORMS}},
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
    assert delta_differences(LAKE, source, schemas, {"endpointUrl": s3_proc, "tableModes": MODES,
                                                     "transforms": TRANSFORMS}) == {}
    storage = delta_storage(LAKE, {"endpointUrl": s3_proc})
    m_b = deltalake.DeltaTable(LAKE + "/public/m_b", storage_options=storage)
    versions = pa.table(m_b.scan())
    assert history_problems(versions, ["k"]) == [] and versions.num_rows > len(source["public.m_b"])
    m_a = pa.table(deltalake.DeltaTable(LAKE + "/public/m_a", storage_options=storage).scan())
    assert pc.sum(m_a["_deleted"]).as_py() > 0  # the deleted keys kept
    assert "b" not in m_a.column_names and "extra" not in m_a.column_names  # excluded, also once the source added it
    m_new = pa.table(deltalake.DeltaTable(LAKE + "/public/m_new", storage_options=storage).scan())
    assert 0 < m_new.num_rows < len(source["public.m_new"]) and "iv" not in m_new.column_names  # the filter's rows
    targets = s3fs.S3FileSystem(endpoint_url=s3_proc).ls("test/lake/public", refresh=True)
    assert sorted(p.rsplit("/", 1)[-1] for p in targets) == ["m_a", "m_b", "m_c", "m_drop", "m_new"]  # never 'other'
    m_c = deltalake.DeltaTable(LAKE + "/public/m_c", storage_options=delta_storage(LAKE, {"endpointUrl": s3_proc}))
    amount = {f.name: f for f in m_c.schema().fields}["amount"]
    assert str(amount.type) == 'PrimitiveType("decimal(14,2)")'  # widened in place
    assert any(h["operation"] == "OPTIMIZE" for h in m_c.history())  # compacted, and still equal to its source
    assert slots_and_publications(pg_url) == (0, [])
