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


# -- the blind-append commit, in process (no Spark) -----------------------------------------

def _schema():
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    return StructType([StructField("split", IntegerType()), StructField("seq", LongType())])


def _epoch(sink, epoch: int, tasks: int = 1, rows: int = 3):
    """Prepare ``tasks`` files of ``rows`` rows each for ``epoch`` (split = task, seq unique per uid and epoch)."""
    import pyarrow as pa

    from flinkish_spark.sink.protocol import PrepareContext

    out = []
    for task in range(tasks):
        seq = [epoch * 1000 + task * 100 + i for i in range(rows)]
        batch = pa.RecordBatch.from_pydict({"split": pa.array([task] * rows, pa.int32()), "seq": pa.array(seq, pa.int64())})
        out.append(sink.prepare(iter([batch]), PrepareContext(sink.uid, epoch, task, 0)))
    return out


def _rows(epochs, tasks: int = 1, rows: int = 3) -> collections.Counter:
    return collections.Counter((t, e * 1000 + t * 100 + i) for e in epochs for t in range(tasks) for i in range(rows))


def test_blind_appends_interleave_recognise_lost_answers_and_revalidate(tmp_path: Path) -> None:
    """Two uids append through the log in turn (each loses versions to the other and moves on);
    a commit whose answer was lost is found in the log; a metadata change by another writer is
    re-validated; a table whose protocol asks more of a writer is committed through delta-rs."""
    from flinkish_spark.connectors import delta

    path = str(tmp_path / "t")
    a = delta.DeltaSink.at(path, uid="a", schema=_schema(), checkpoint_interval=4)
    b = delta.DeltaSink.at(path, uid="b", schema=_schema(), checkpoint_interval=4)
    for epoch in range(3):
        assert a.commit(_epoch(a, epoch), epoch) == "COMMITTED"
        assert b.commit(_epoch(b, epoch), epoch) == "COMMITTED"  # its head is one version behind: it reads a's
    assert txn_versions(path, "a") == txn_versions(path, "b") == [0, 1, 2]
    assert read_delta(path) == _rows(range(3)) + _rows(range(3))
    assert (tmp_path / "t" / "_delta_log" / "00000000000000000004.checkpoint.parquet").exists()
    log = json.loads((tmp_path / "t" / "_delta_log" / "00000000000000000006.json").read_text().splitlines()[1])
    assert log == {"txn": {"appId": "b", "version": 2, "lastUpdated": log["txn"]["lastUpdated"]}}

    # a's commit of epoch 3 lands but its answer is lost: the process still thinks it is at epoch 2
    head = a._head().log
    assert a.commit(_epoch(a, 3), 3) == "COMMITTED"
    head.version, head.txn = head.version - 1, 2
    assert a.commit(_epoch(a, 3), 3) == "ALREADY_COMMITTED"  # the put lost against its own commit
    assert deltalake.DeltaTable(path).version() == 7 and txn_versions(path, "a") == [0, 1, 2, 3]

    # another writer changes the table's properties (a metaData action): re-validated, still ours
    deltalake.DeltaTable(path).alter.set_table_properties({"delta.appendOnly": "true"})
    assert b.commit(_epoch(b, 3), 3) == "COMMITTED" and b._head().blind_append
    # a check constraint needs writer version 3: such a table is committed through delta-rs
    deltalake.DeltaTable(path).alter.add_constraint({"seq_positive": "seq >= 0"})
    assert a.commit(_epoch(a, 4), 4) == "COMMITTED"
    assert a._head() is None or not a._head().blind_append
    assert a.commit(_epoch(a, 4), 4) == "ALREADY_COMMITTED"
    assert txn_versions(path, "a") == [0, 1, 2, 3, 4] and txn_versions(path, "b") == [0, 1, 2, 3]
    assert read_delta(path) == _rows(range(5)) + _rows(range(4))
    # another writer changes the schema: the next commit fails clearly instead of appending
    deltalake.DeltaTable(path).alter.add_columns(deltalake.Field("extra", "string"))
    with pytest.raises(TableMismatchError, match="has the schema"):
        b.commit(_epoch(b, 4), 4)
    assert txn_versions(path, "b") == [0, 1, 2, 3]


def test_blind_append_never_writes_behind_a_cleaned_up_log(tmp_path: Path) -> None:
    """A head older than the newest checkpoint whose next commit is gone (log cleanup) is
    reloaded; the put-if-absent would otherwise write a version readers never see."""
    from flinkish_spark.connectors import delta

    path = str(tmp_path / "t")
    sink = delta.DeltaSink.at(path, uid="u", schema=_schema(), checkpoint_interval=0)
    for epoch in range(3):
        assert sink.commit(_epoch(sink, epoch), epoch) == "COMMITTED"
    other = deltalake.DeltaTable(path)
    other.create_checkpoint()  # at version 3
    head = sink._head().log
    head.version, head.txn = 1, 0  # a head from before versions 2 and 3 ...
    (tmp_path / "t" / "_delta_log" / "00000000000000000002.json").unlink()  # ... which cleanup removed
    assert sink.commit(_epoch(sink, 3), 3) == "COMMITTED"
    assert deltalake.DeltaTable(path).version() == 4 and not (tmp_path / "t" / "_delta_log" / "00000000000000000002.json").exists()
    assert read_delta(path) == _rows(range(4))


def test_a_table_deleted_between_two_queries_of_one_process_gets_the_second_querys_rows(tmp_path: Path) -> None:
    """Spark reuses the driver's Python workers across queries: the second query's sink (a new
    checkpoint, epochs from 0 again) finds the first one's head in the process. It must create the
    table again and append, not answer 'already committed' from the deleted table's txn."""
    import shutil

    from flinkish_spark.connectors import delta

    path = str(tmp_path / "t")
    first = delta.DeltaSink.at(path, uid="u", schema=_schema(), checkpoint_interval=0)
    for epoch in range(3):
        assert first.commit(_epoch(first, epoch), epoch) == "COMMITTED"
    shutil.rmtree(path)
    second = delta.DeltaSink.at(path, uid="u", schema=_schema(), checkpoint_interval=0)
    for epoch in range(2):
        assert second.commit(_epoch(second, epoch), epoch) == "COMMITTED"
    assert read_delta(path) == _rows(range(2)) and txn_versions(path, "u") == [0, 1]


def test_compact_every_compacts_files_and_rows_stay_exactly_once(tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink

    path = str(tmp_path / "t")
    sink = DeltaSink.at(path, uid="u", schema=_schema(), compact_every=4, checkpoint_interval=0)
    prepared = {}
    for epoch in range(8):  # 2 files per epoch; versions 4 and 8 are followed by a compaction
        prepared[epoch] = _epoch(sink, epoch, tasks=2)
        assert sink.commit(prepared[epoch], epoch) == "COMMITTED"
        sink.cleanup(epoch, prepared[epoch])
    table = deltalake.DeltaTable(path)
    operations = [h["operation"] for h in reversed(table.history())]
    assert operations.count("OPTIMIZE") == 2
    assert len(table.file_uris()) <= 4  # 16 without compaction
    assert read_delta(path) == _rows(range(8), tasks=2)
    assert txn_versions(path, "u") == list(range(8))
    # a replay after compaction adds nothing, and its cleanup deletes nothing the table names
    again = _epoch(sink, 7, tasks=2)
    assert sink.commit(prepared[7], 7) == "ALREADY_COMMITTED"
    sink.abort(again, 7)
    sink.cleanup(7, prepared[7])
    assert read_delta(path) == _rows(range(8), tasks=2)
    assert deltalake.DeltaTable(path).version() == table.version()
