"""flinkish.iceberg on real Spark: rows read back with a pyiceberg scan and DuckDB, one snapshot per epoch, errors."""

from __future__ import annotations

import collections
from pathlib import Path

import duckdb
import pytest

from flinkish_spark.errors import ConfigError, TableMismatchError

pyiceberg = pytest.importorskip("pyiceberg")

LENGTHS = [700, 300]


def sequence(spark, meta: str, uid: str = "seq"):
    return (spark.readStream.format("flinkish.sequence").option("uid", uid).option("checkpoint", meta)
            .option("rowsPerSplit", ",".join(map(str, LENGTHS))).option("maxRowsPerTrigger", "400").load())


def expected() -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(LENGTHS) for i in range(n))


def run(df, cp: Path, uid: str = "out", **options: str) -> None:
    w = (df.writeStream.format("flinkish.iceberg").option("uid", uid).option("table", "db.events")
         .option("checkpointLocation", str(cp)).option("rowsPerFile", "150"))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None, q.exception()


def load(catalog_uri: str, warehouse: str, extra: dict | None = None):
    from pyiceberg.catalog.sql import SqlCatalog

    # A SQL catalog's tables belong to the catalog name: the sink's catalogs are named "flinkish".
    return SqlCatalog("flinkish", uri=catalog_uri, warehouse=warehouse, **(extra or {})).load_table("db.events")


def embedded(cp: Path):
    folder = cp / "flinkish" / "iceberg"
    return load(f"sqlite:///{folder}/catalog.db", f"file://{folder}/warehouse")


def read_iceberg(table, duck: bool = True) -> collections.Counter:
    """Rows as a pyiceberg scan and DuckDB (over the scan's planned files) see them; both must agree."""
    t = table.scan(selected_fields=("split", "seq")).to_arrow()
    rows = collections.Counter(zip(t["split"].to_pylist(), t["seq"].to_pylist()))
    if duck:
        files = ", ".join(f"'{f.file.file_path.removeprefix('file://')}'" for f in table.scan().plan_files())
        assert collections.Counter(duckdb.sql(f"select split, seq from read_parquet([{files}])").fetchall()) == rows
    return rows


def snapshot_epochs(table, uid: str = "out") -> list[int]:
    return sorted(int(s.summary.additional_properties["flinkish.epoch"]) for s in table.snapshots()
                  if s.summary.additional_properties.get("flinkish.uid") == uid)


def stray_files(table) -> set[str]:
    location = table.location().removeprefix("file://")
    named = set()
    for task in table.scan().plan_files():
        named.add(task.file.file_path.removeprefix("file://"))
        named.update(d.file_path.removeprefix("file://") for d in task.delete_files)
    return {str(p) for p in Path(location, "data").rglob("*.parquet")} - named


def test_rows_exactly_once_one_snapshot_per_epoch(spark, tmp_path: Path) -> None:
    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp")
    table = embedded(tmp_path / "cp")
    assert read_iceberg(table) == expected()
    assert snapshot_epochs(table) == [0, 1, 2]  # 1000 rows at 400 per epoch
    assert len(table.snapshots()) == 3
    assert stray_files(table) == set()
    assert [f.field_id for f in table.schema().fields] == [1, 2, 3]
    assert [str(f.field_type) for f in table.schema().fields] == ["int", "long", "timestamptz"]


def test_partitioned_table_and_foreach_batch_into_it(spark, tmp_path: Path) -> None:
    from flinkish_spark import transactional
    from flinkish_spark.connectors.iceberg import IcebergSink

    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", partitionBy="split")
    table = embedded(tmp_path / "cp")
    assert [f.name for f in table.spec().fields] == ["split"]
    assert sorted(table.scan(row_filter="split = 1").to_arrow()["seq"].to_pylist()) == list(range(300))
    # a foreachBatch query (another uid) appends to the same table through the same catalog
    df = sequence(spark, str(tmp_path / "meta2"), uid="seq2")
    sink = IcebergSink.at("db.events", uid="fb", schema=df.schema, checkpoint=str(tmp_path / "cp" / "flinkish"),
                          partition_by=("split",))
    q = (df.writeStream.foreachBatch(transactional(sink, uid="fb", checkpoint=str(tmp_path / "fbmeta")))
         .option("checkpointLocation", str(tmp_path / "cp2")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    table = embedded(tmp_path / "cp")
    assert read_iceberg(table) == expected() + expected()
    assert snapshot_epochs(table, "fb") == snapshot_epochs(table, "out") == [0, 1, 2]


def test_commit_is_idempotent_and_cleanup_removes_failed_attempts(spark, tmp_path: Path) -> None:
    import pyarrow as pa

    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.sink.protocol import PrepareContext

    schema = spark.createDataFrame([], "split int, seq long").schema
    sink = IcebergSink.at("db.events", uid="u", schema=schema, checkpoint=str(tmp_path))
    batch = pa.RecordBatch.from_pydict({"split": pa.array([0, 0], pa.int32()), "seq": [1, 2]})
    kept = sink.prepare(iter([batch]), PrepareContext("u", 3, 0, 0))
    failed = sink.prepare(iter([batch]), PrepareContext("u", 3, 0, 1))
    assert kept is not None and failed is not None and sink.decode(sink.encode(kept)) == kept
    assert sink.commit([kept], 3) == "COMMITTED"
    assert sink.commit([kept], 3) == "ALREADY_COMMITTED"
    assert sink.commit([kept], 2) == "ALREADY_COMMITTED"
    sink.cleanup(3, [kept])
    table = sink.catalog().load_table("db.events")
    assert len(table.snapshots()) == 1 and table.scan().to_arrow()["seq"].to_pylist() == [1, 2]
    assert stray_files(table) == set()
    sink.cleanup(3, [])  # the decision is gone but the table has the epoch: nothing is deleted
    assert len(list(Path(table.location().removeprefix("file://"), "data").rglob("*.parquet"))) == 1


def test_errors_are_clear_and_write_nothing(spark, tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg import IcebergSink

    two = spark.createDataFrame([], "split int, seq long").schema
    IcebergSink.at("db.events", uid="u", schema=two, checkpoint=str(tmp_path))
    table = lambda: IcebergSink.at("db.events", uid="u", schema=two, checkpoint=str(tmp_path)).catalog().load_table("db.events")  # noqa: E731
    before = table().metadata_location
    with pytest.raises(TableMismatchError, match=r"has the schema \[\('split', 'int'\), \('seq', 'long'\)\], but the query writes \[\('split', 'int'\), \('seq', 'string'\)\]"):
        IcebergSink.at("db.events", uid="u", schema=spark.createDataFrame([], "split int, seq string").schema, checkpoint=str(tmp_path))
    with pytest.raises(TableMismatchError, match=r"is partitioned by \[\], but the option 'partitionBy' asks for \['split'\]"):
        IcebergSink.at("db.events", uid="u", schema=two, checkpoint=str(tmp_path), partition_by=("split",))
    assert table().metadata_location == before and table().snapshots() == []
    with pytest.raises(TableMismatchError, match="does not exist in the catalog 'flinkish' and createTable is false"):
        IcebergSink.at("db.other", uid="u", schema=two, checkpoint=str(tmp_path), create_table=False)
    with pytest.raises(ConfigError, match=r"unknown Iceberg catalog 'nope': no entry in .pyiceberg.yaml"):
        IcebergSink.at("db.events", uid="u", schema=two, catalog="nope")
    with pytest.raises(ConfigError, match=r"'table' must be namespace.name"):
        IcebergSink.at("events", uid="u", schema=two, checkpoint=str(tmp_path))
    with pytest.raises(ConfigError, match="does not map to Iceberg"):
        IcebergSink.at("db.m", uid="u", schema=spark.createDataFrame([], "m map<string,int>").schema, checkpoint=str(tmp_path))


def test_format_refuses_another_schema_before_any_task(spark, tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg import IcebergSink

    IcebergSink.at("db.events", uid="u", schema=spark.createDataFrame([], "x string").schema,
                   checkpoint=str(tmp_path / "cp" / "flinkish"))
    with pytest.raises(Exception, match="TableMismatchError") as info:
        run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp")
    assert "the query writes" in str(info.value)
    table = embedded(tmp_path / "cp")
    assert table.snapshots() == [] and not Path(table.location().removeprefix("file://"), "data").exists()


@pytest.mark.s3
def test_s3_warehouse_with_sql_catalog(spark, s3_proc: str, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/catalog.db"
    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", catalogUri=uri, warehouse="s3://test/wh", endpointUrl=s3_proc)
    table = load(uri, "s3://test/wh", {"s3.endpoint": s3_proc})
    assert read_iceberg(table, duck=False) == expected()
    assert snapshot_epochs(table) == [0, 1, 2]
    assert all(f.file.file_path.startswith("s3://test/wh/db/events/data/flinkish/out/e") for f in table.scan().plan_files())


@pytest.mark.s3
def test_s3_unreachable_is_a_clear_error(spark, tmp_path: Path) -> None:
    df = sequence(spark, str(tmp_path / "meta"))
    with pytest.raises(Exception, match="StorageUnavailableError") as info:
        (df.writeStream.format("flinkish.iceberg").option("uid", "out").option("table", "db.events")
         .option("catalogUri", f"sqlite:///{tmp_path}/c.db").option("warehouse", "s3://test/wh")
         .option("endpointUrl", "http://127.0.0.1:9").option("checkpointLocation", str(tmp_path / "cp")).start().awaitTermination(120))
    assert "the storage endpoint http://127.0.0.1:9 did not answer" in str(info.value)
    assert not (tmp_path / "c.db").exists()  # failed before the catalog was opened


def test_commits_expire_snapshots_merge_manifests_and_keep_every_uids_record(tmp_path: Path) -> None:
    """What keeps a commit's cost flat (see connectors/iceberg/commit.py): retainSnapshots expires old snapshots
    (and their manifest lists) in the commit itself, never a uid's newest; manifests are merged
    at the table's min-count; rows and idempotence stay."""
    import pyarrow as pa
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.sink.protocol import PrepareContext

    schema = StructType([StructField("split", IntegerType()), StructField("seq", LongType())])
    batch = pa.RecordBatch.from_pydict({"split": pa.array([0], pa.int32()), "seq": [1]})
    other = IcebergSink.at("db.events", uid="other", schema=schema, checkpoint=str(tmp_path))
    assert other.commit([other.prepare(iter([batch]), PrepareContext("other", 7, 0, 0))], 7) == "COMMITTED"
    table = other.catalog().load_table("db.events")
    assert table.properties["commit.manifest-merge.enabled"] == "true"  # set on the tables the sink creates
    with table.transaction() as tx:
        tx.set_properties({"commit.manifest.min-count-to-merge": "4"})
    sink = IcebergSink.at("db.events", uid="u", schema=schema, checkpoint=str(tmp_path), retain_snapshots=5)
    manifests = []
    for epoch in range(30):
        assert sink.commit([sink.prepare(iter([batch]), PrepareContext("u", epoch, 0, 0))], epoch) == "COMMITTED"
        table = sink.catalog().load_table("db.events")
        manifests.append(len(table.current_snapshot().manifests(table.io)))
    assert len(table.snapshots()) == 5 + 1  # the newest 5, and other's only record
    assert snapshot_epochs(table, "other") == [7] and snapshot_epochs(table, "u") == list(range(25, 30))
    lists = list(Path(table.location().removeprefix("file://"), "metadata").glob("snap-*.avro"))
    assert len(lists) == 6  # the expired snapshots' manifest lists are deleted
    assert max(manifests) <= 4 and manifests[-1] < manifests[-2]  # merged whenever 4 small ones pile up
    assert read_iceberg(table) == collections.Counter({(0, 1): 31})  # expiry and merging never touch rows
    assert sink.commit([], 3) == other.commit([], 7) == "ALREADY_COMMITTED"


def test_catalog_name_is_the_name_readers_load_the_catalog_with(tmp_path: Path) -> None:
    """A SQL catalog files tables under its name: 'catalogName' picks it; a table filed under another
    name in the same database is named in the error instead of being created a second time."""
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    from flinkish_spark.connectors.iceberg import IcebergSink
    from flinkish_spark.sink.protocol import PrepareContext

    schema = StructType([StructField("split", IntegerType()), StructField("seq", LongType())])
    uri, warehouse = f"sqlite:///{tmp_path}/catalog.db", f"file://{tmp_path}/wh"
    sink = IcebergSink.at("db.events", uid="u", schema=schema, catalog_uri=uri, warehouse=warehouse, catalog_name="lake")
    batch = pa.RecordBatch.from_pydict({"split": pa.array([0], pa.int32()), "seq": [5]})
    assert sink.commit([sink.prepare(iter([batch]), PrepareContext("u", 0, 0, 0))], 0) == "COMMITTED"
    assert SqlCatalog("lake", uri=uri, warehouse=warehouse).load_table("db.events").scan().to_arrow()["seq"].to_pylist() == [5]
    assert not SqlCatalog("flinkish", uri=uri, warehouse=warehouse).table_exists("db.events")
    with pytest.raises(TableMismatchError, match=r"not filed under the catalog name 'flinkish', but this catalog's "
                                                 r"database has it under \['lake'\].*Set the option 'catalogName' to 'lake'"):
        IcebergSink.at("db.events", uid="u", schema=schema, catalog_uri=uri, warehouse=warehouse)
    assert not SqlCatalog("flinkish", uri=uri, warehouse=warehouse).table_exists("db.events")  # nothing created
    with pytest.raises(ConfigError, match="'catalogName' must not be empty"):
        IcebergSink.at("db.events", uid="u", schema=schema, catalog_uri=uri, warehouse=warehouse, catalog_name=" ")
    with pytest.raises(ConfigError, match="the configured catalog 'prod' files its tables under its own name"):
        IcebergSink.at("db.events", uid="u", schema=schema, catalog="prod", catalog_name="lake")


def test_upsert_through_write_stream(spark, tmp_path: Path) -> None:
    """mode=upsert through writeStream: keys rewritten many times across epochs and tasks, deletes."""
    # keys of one split are its own (split * 100 + seq % 40); a split's rows come in seq order
    df = sequence(spark, str(tmp_path / "meta")).selectExpr(
        "split * 100 + seq % 40 AS id", "split", "concat('v', split, '-', seq) AS v",
        "CASE WHEN seq % 9 = 0 THEN 'd' ELSE 'u' END AS _op", "seq AS _lsn")
    run(df, tmp_path / "cp", mode="upsert", key="id", deletes="true")
    state: dict[int, tuple] = {}
    for split, seq in sorted(expected()):
        if seq % 9 == 0:
            state.pop(split * 100 + seq % 40, None)
        else:
            state[split * 100 + seq % 40] = (split, f"v{split}-{seq}")
    table = embedded(tmp_path / "cp")
    t = table.scan().to_arrow()
    assert sorted(zip(t["id"].to_pylist(), t["split"].to_pylist(), t["v"].to_pylist())) == \
        sorted((k, *v) for k, v in state.items())
    assert [f.name for f in table.schema().fields] == ["id", "split", "v"]
    assert snapshot_epochs(table) == [0, 1, 2] and stray_files(table) == set()
