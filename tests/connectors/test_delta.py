"""flinkish.delta on real Spark: rows read back with deltalake and DuckDB, one version per epoch, errors."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import duckdb
import pytest

from flinkish_spark.errors import TableMismatchError

deltalake = pytest.importorskip("deltalake")

LENGTHS = [700, 300]


def sequence(spark, meta: str, lengths: list[int] = LENGTHS, uid: str = "seq", per_trigger: int = 400):
    return (spark.readStream.format("flinkish.sequence").option("uid", uid).option("checkpoint", meta)
            .option("rowsPerSplit", ",".join(map(str, lengths))).option("maxRowsPerTrigger", str(per_trigger)).load())


def expected(lengths: list[int] = LENGTHS) -> collections.Counter:
    return collections.Counter((k, i) for k, n in enumerate(lengths) for i in range(n))


def run(df, cp: Path, path: str, uid: str = "out", **options: str) -> None:
    w = (df.writeStream.format("flinkish.delta").option("uid", uid).option("path", path)
         .option("checkpointLocation", str(cp)).option("rowsPerFile", "150"))
    for k, v in options.items():
        w = w.option(k, v)
    q = w.trigger(availableNow=True).start()
    q.awaitTermination()
    assert q.exception() is None, q.exception()


def read_delta(path: str, storage_options: dict | None = None) -> collections.Counter:
    """Rows as deltalake and DuckDB (over the files deltalake lists) see them; both must agree."""
    table = deltalake.DeltaTable(path, storage_options=storage_options)
    arrow = table.to_pyarrow_table(columns=["split", "seq"])
    rows = collections.Counter(zip(arrow["split"].to_pylist(), arrow["seq"].to_pylist()))
    uris = table.file_uris()
    if uris and storage_options is None:
        files = ", ".join(f"'{u}'" for u in uris)
        duck = collections.Counter(duckdb.sql(f"select split, seq from read_parquet([{files}], hive_partitioning=true)").fetchall())
        assert duck == rows
    return rows


def txn_versions(path: str, uid: str, storage_options: dict | None = None) -> list[int]:
    """The epoch each table version committed for ``uid``, from the log's commit info."""
    table = deltalake.DeltaTable(path, storage_options=storage_options)
    out = []
    for h in table.history():
        if h.get("flinkish.uid") == uid:
            out.append(int(h["flinkish.epoch"]))
    return sorted(out)


def data_files(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts}


def test_rows_exactly_once_one_version_per_epoch(spark, tmp_path: Path) -> None:
    out = tmp_path / "table"
    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", str(out), checkpointInterval="2")
    assert read_delta(str(out)) == expected()
    table = deltalake.DeltaTable(str(out))
    epochs = sorted(int(p.name) for p in (tmp_path / "cp" / "commits").iterdir() if p.name.isdigit())
    assert txn_versions(str(out), "out") == epochs == [0, 1, 2]  # 1000 rows at 400 per epoch
    assert table.transaction_version("out") == 2
    assert table.version() == 3  # the create, then one version per epoch
    # every data file on disk is named by the log; the log's are all there
    assert data_files(out) == {u[len(str(out)) + 1:] for u in table.file_uris()}
    assert all(f.startswith("flinkish/out/e") for f in data_files(out))
    assert (out / "_delta_log" / "00000000000000000002.checkpoint.parquet").exists()  # checkpointInterval=2
    stats = __import__("pyarrow").table(table.get_add_actions(flatten=True)).to_pydict()
    assert sum(stats["num_records"]) == 1000 and min(stats["min.seq"]) == 0 and max(stats["max.seq"]) == 699


def test_partitioned_table_and_second_run_appends(spark, tmp_path: Path) -> None:
    out = tmp_path / "table"
    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", str(out), partitionBy="split")
    table = deltalake.DeltaTable(str(out))
    assert table.metadata().partition_columns == ["split"]
    assert read_delta(str(out)) == expected()
    assert sorted(table.to_pyarrow_table(filters=[("split", "=", 1)])["seq"].to_pylist()) == list(range(300))
    # another query (new uid, new checkpoint) appends to the same table
    run(sequence(spark, str(tmp_path / "meta2"), uid="seq2"), tmp_path / "cp2", str(out), uid="out2", partitionBy="split")
    assert read_delta(str(out)) == expected() + expected()


def test_foreach_batch_transactional(spark, tmp_path: Path) -> None:
    from flinkish_spark import transactional
    from flinkish_spark.connectors.delta import DeltaSink

    df = sequence(spark, str(tmp_path / "meta"))
    sink = DeltaSink.at(str(tmp_path / "table"), uid="fb", schema=df.schema, partition_by=("split",))
    q = (df.writeStream.foreachBatch(transactional(sink, uid="fb", checkpoint=str(tmp_path / "fbmeta")))
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    q.awaitTermination()
    assert q.exception() is None
    assert read_delta(str(tmp_path / "table")) == expected()
    assert txn_versions(str(tmp_path / "table"), "fb") == [0, 1, 2]


def test_commit_is_idempotent_and_cleanup_spares_the_table(spark, tmp_path: Path) -> None:
    """A repeated commit of an epoch adds no version; cleanup deletes only unnamed files."""
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.sink.protocol import PrepareContext
    import pyarrow as pa

    df = sequence(spark, str(tmp_path / "meta"))
    sink = DeltaSink.at(str(tmp_path / "t"), uid="u", schema=df.schema)
    batch = pa.RecordBatch.from_pydict({"split": pa.array([0, 0], pa.int32()), "seq": [1, 2],
                                        "ts": pa.array([0, 1], pa.timestamp("us", "UTC"))})
    kept = sink.prepare(iter([batch]), PrepareContext("u", 5, 0, 0))
    failed = sink.prepare(iter([batch]), PrepareContext("u", 5, 0, 1))  # a failed attempt's files
    assert kept is not None and failed is not None
    assert sink.decode(sink.encode(kept)) == kept
    assert sink.commit([kept], 5) == "COMMITTED"
    assert sink.commit([kept], 5) == "ALREADY_COMMITTED"
    assert sink.commit([kept], 4) == "ALREADY_COMMITTED"  # an older epoch is in too
    sink.cleanup(5, [kept])
    table = deltalake.DeltaTable(str(tmp_path / "t"))
    assert table.version() == 1 and table.to_pyarrow_table()["seq"].to_pylist() == [1, 2]
    assert data_files(tmp_path / "t") == {u[len(str(tmp_path / "t")) + 1:] for u in table.file_uris()}
    sink.cleanup(5, [])  # the decision is gone but the table has the epoch: nothing is deleted
    assert len(data_files(tmp_path / "t")) == 1


def schema_of(spark, ddl: str):
    return spark.createDataFrame([], ddl).schema


def test_errors_are_clear_and_write_nothing(spark, tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink

    deltalake.write_deltalake(str(tmp_path / "other"), __import__("pyarrow").table({"x": ["a"]}))
    before = sorted(p.name for p in (tmp_path / "other").rglob("*"))
    with pytest.raises(TableMismatchError, match=r"has the schema \[\('x', 'PrimitiveType\(\"string\"\)'\)\], but the query writes"):
        DeltaSink.at(str(tmp_path / "other"), uid="u", schema=schema_of(spark, "x long"))
    deltalake.write_deltalake(str(tmp_path / "two"), __import__("pyarrow").table({"x": ["a"], "y": [1]}))
    with pytest.raises(TableMismatchError, match=r"is partitioned by \[\], but the option 'partitionBy' asks for \['x'\]"):
        DeltaSink.at(str(tmp_path / "two"), uid="u", schema=schema_of(spark, "x string, y long"), partition_by=("x",))
    assert sorted(p.name for p in (tmp_path / "other").rglob("*")) == before
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("hi")
    with pytest.raises(TableMismatchError, match=r"is not a Delta table \(no _delta_log\) but holds other files \(notes.txt\)"):
        DeltaSink.at(str(tmp_path / "plain"), uid="u", schema=schema_of(spark, "x long"))
    assert [p.name for p in (tmp_path / "plain").iterdir()] == ["notes.txt"]
    with pytest.raises(TableMismatchError, match="there is no Delta table at .* and createTable is false"):
        DeltaSink.at(str(tmp_path / "new"), uid="u", schema=schema_of(spark, "x long"), create_table=False)
    assert not (tmp_path / "new").exists()


def test_format_refuses_another_schema_before_any_task(spark, tmp_path: Path) -> None:
    deltalake.write_deltalake(str(tmp_path / "t"), __import__("pyarrow").table({"x": ["a"]}))
    with pytest.raises(Exception, match="TableMismatchError") as info:
        run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", str(tmp_path / "t"))
    assert "the query writes" in str(info.value)
    assert deltalake.DeltaTable(str(tmp_path / "t")).version() == 0
    assert not (tmp_path / "t" / "flinkish").exists()


@pytest.mark.s3
def test_s3_table_is_exactly_once(spark, s3_proc: str, tmp_path: Path) -> None:
    s3 = s3_proc
    run(sequence(spark, str(tmp_path / "meta")), tmp_path / "cp", "s3://test/table", endpointUrl=s3)
    opts = {"AWS_ENDPOINT_URL": s3, "AWS_ALLOW_HTTP": "true"}
    assert read_delta("s3://test/table", opts) == expected()
    assert txn_versions("s3://test/table", "out", opts) == [0, 1, 2]


@pytest.mark.s3
def test_s3_unreachable_is_a_clear_error(spark, tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.errors import StorageUnavailableError

    with pytest.raises(StorageUnavailableError, match="did not answer"):
        DeltaSink.at("s3://test/table", uid="u", schema=schema_of(spark, "x long"), options={"endpointUrl": "http://127.0.0.1:9"})
