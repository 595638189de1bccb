"""Each error of flinkish.postgres: its type, a message that names the thing and the fix,
no password in it, and nothing written to the target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from flinkish_spark.connectors.postgres import PostgresSink
from flinkish_spark.connectors.postgres.connection import connect, parse_url
from flinkish_spark.embedded.postgres import free_port
from flinkish_spark.errors import (
    ConfigError, DatabaseAccessError, DatabaseUnavailableError, TargetSchemaError, TargetWriteError,
)
from flinkish_spark.sink.foreach_batch import transactional

SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def q(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as c:
        cur = c.execute(sql)
        return cur.fetchall() if cur.description else []


def test_import_needs_neither_psycopg_nor_adbc() -> None:
    code = "import sys, flinkish_spark, flinkish_spark.connectors.postgres.sink; print(sorted(m for m in sys.modules if m.startswith(('psycopg', 'adbc'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_password_is_split_off_and_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    info = parse_url("postgresql://alice:p%40ss@db.example:5432/app?sslmode=require")
    assert info.url == "postgresql://alice@db.example:5432/app?sslmode=require"
    assert info.masked == "postgresql://alice:***@db.example:5432/app?sslmode=require"
    assert "p@ss" not in repr(info) and info.password() == "p@ss"
    assert info.mask("FATAL: bad p@ss here") == "FATAL: bad *** here"
    monkeypatch.setenv("MY_PG_SECRET", "hunter2")
    env = parse_url("postgresql://alice@db/app", password_env="MY_PG_SECRET")
    assert env.password() == "hunter2" and "hunter2" not in env.masked + repr(env)
    monkeypatch.delenv("MY_PG_SECRET")
    with pytest.raises(ConfigError, match="passwordEnv.*MY_PG_SECRET.*not set"):
        env.password()
    with pytest.raises(ConfigError, match="libpq URI"):
        parse_url("jdbc:postgresql://db/app")


def test_unreachable_server_is_retryable_with_password_masked() -> None:
    url = f"postgresql://alice:s3cret@127.0.0.1:{free_port()}/app"
    with pytest.raises(DatabaseUnavailableError) as e:
        PostgresSink.create(url, "public.t", uid="out", schema=SCHEMA)
    text = str(e.value)
    assert "unreachable" in text and "postgresql://alice:***@127.0.0.1" in text and "s3cret" not in text


def test_authentication_failure_is_terminal_with_password_masked(postgres, pg_url: str) -> None:
    q(pg_url, "DROP ROLE IF EXISTS writer; CREATE ROLE writer LOGIN PASSWORD 'right'")
    bad = pg_url.replace("postgres@", "nobody:s3cret@")
    with pytest.raises(DatabaseAccessError) as e:
        PostgresSink.create(bad, "public.t", uid="out", schema=SCHEMA)
    assert "refused the connection" in str(e.value) and "nobody" in str(e.value) and "s3cret" not in str(e.value)
    assert "***" in str(e.value)


def test_missing_table_without_create_table(pg_url: str) -> None:
    with pytest.raises(TargetSchemaError, match=r"table public\.t does not exist.*createTable=true"):
        PostgresSink.create(pg_url, "public.t", uid="out", schema=SCHEMA)
    assert q(pg_url, "SELECT to_regclass('public.t')") == [(None,)]


def test_missing_and_incompatible_columns(pg_url: str) -> None:
    q(pg_url, "CREATE TABLE t (id bigint)")
    with pytest.raises(TargetSchemaError, match=r"has no column 'name'.*ADD COLUMN \"name\" text"):
        PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA)
    q(pg_url, "DROP TABLE t; CREATE TABLE t (id integer, name text)")
    with pytest.raises(TargetSchemaError, match=r"column 'id' of public\.t is integer, which cannot hold the query's bigint"):
        PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA)


def test_upsert_needs_a_key_that_is_unique_in_the_target(pg_url: str) -> None:
    with pytest.raises(ConfigError, match="mode 'upsert' needs option 'key'"):
        PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, mode="upsert")
    q(pg_url, "CREATE TABLE t (id bigint, name text)")
    with pytest.raises(TargetSchemaError, match=r"needs a unique key on \(id\).*ADD PRIMARY KEY \(id\)"):
        PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, mode="upsert", key="id")
    q(pg_url, "CREATE UNIQUE INDEX ON t (id)")
    assert PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, mode="upsert", key="id").commit_mode == "staged"


def test_prepared_upsert_is_refused_with_the_deadlock_reason(spark, tmp_path: Path, pg_url: str) -> None:
    with pytest.raises(ConfigError, match="would deadlock.*prepared row lock.*COMMIT PREPARED"):
        PostgresSink.create(pg_url, "t", uid="out", schema=SCHEMA, mode="upsert", key="id", commit_mode="prepared",
                            create_table=True)
    df = spark.readStream.format("flinkish.sequence").option("uid", "s").option("checkpoint", str(tmp_path / "m")).option("rowsPerSplit", "5").load()
    with pytest.raises(Exception, match="would deadlock"):  # at start() or when the query runs the sink
        (df.writeStream.format("flinkish.postgres").option("uid", "out").option("url", pg_url).option("table", "t")
         .option("mode", "upsert").option("key", "seq").option("commitMode", "prepared")
         .option("checkpointLocation", str(tmp_path / "cp")).start().awaitTermination())
    assert q(pg_url, "SELECT to_regclass('public.t')") == [(None,)]


@pytest.fixture(scope="module")
def no_2pc_server(postgres):
    if postgres.embedded is None:
        pytest.skip("needs the embedded server (a second one with max_prepared_transactions = 0)")
    from flinkish_spark.embedded.postgres import temporary_postgres

    with temporary_postgres("flinkish-test-pg0-", settings={"max_prepared_transactions": "0"}) as server:
        yield server


def test_prepared_on_a_server_without_prepared_transactions(no_2pc_server) -> None:
    url = no_2pc_server.uri
    with pytest.raises(ConfigError, match="max_prepared_transactions = 0.*commitMode 'staged'"):
        PostgresSink.create(url, "t0", uid="out", schema=SCHEMA, commit_mode="prepared", create_table=True)
    assert PostgresSink.create(url, "t0", uid="out", schema=SCHEMA, create_table=True).commit_mode == "staged"  # auto


@pytest.mark.parametrize("mode", ["prepared", "staged"])
def test_constraint_violation_fails_the_epoch_and_leaves_nothing(spark, tmp_path: Path, pg_url: str, mode: str) -> None:
    q(pg_url, "CREATE TABLE t (split integer, seq bigint CHECK (seq <> 150), ts timestamptz)")
    df = (spark.readStream.format("flinkish.sequence").option("uid", "s").option("checkpoint", str(tmp_path / "m"))
          .option("rowsPerSplit", "300,300").load())
    query = (df.writeStream.format("flinkish.postgres").option("uid", "out").option("url", pg_url).option("table", "t")
             .option("commitMode", mode).option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    with pytest.raises(Exception) as e:
        query.awaitTermination()
    assert "TargetWriteError" in str(e.value) and "t_seq_check" in str(e.value)
    assert q(pg_url, "SELECT count(*) FROM t") == [(0,)]
    assert q(pg_url, "SELECT gid FROM pg_prepared_xacts") == []


def test_server_restart_between_prepare_and_commit(spark, postgres, tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if postgres.embedded is None:
        pytest.skip("restarts the embedded server")
    schema = StructType([StructField("split", LongType()), StructField("seq", LongType())])
    sink = PostgresSink.create(pg_url, "t", uid="out", schema=schema, create_table=True, commit_mode="prepared")
    restarts = []
    commit = PostgresSink.commit

    def restart_before_commit(self, committables, epoch):  # type: ignore[no-untyped-def]
        if not restarts:
            # the tasks prepared: their transactions must survive pg_ctl restart
            assert len(q(pg_url, "SELECT gid FROM pg_prepared_xacts")) == len(committables) > 0
            postgres.embedded.restart()
            restarts.append(epoch)
        return commit(self, committables, epoch)

    # foreachBatch commits in this (the driver's) process; tasks get the sink unpatched.
    monkeypatch.setattr(PostgresSink, "commit", restart_before_commit)
    target = sink
    df = (spark.readStream.format("flinkish.sequence").option("uid", "s").option("checkpoint", str(tmp_path / "m"))
          .option("rowsPerSplit", "300,200").load().selectExpr("CAST(split AS BIGINT) AS split", "seq"))
    query = (df.writeStream.foreachBatch(transactional(target, uid="out", checkpoint=str(tmp_path / "fb")))
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None and restarts == [0]
    rows = q(pg_url, "SELECT split, seq FROM t")
    assert sorted(rows) == sorted([(0, i) for i in range(300)] + [(1, i) for i in range(200)])
    assert q(pg_url, "SELECT gid FROM pg_prepared_xacts") == []


def test_missing_driver_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from flinkish_spark.errors import EnvironmentSetupError

    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails as if not installed
    monkeypatch.setitem(sys.modules, "adbc_driver_postgresql.dbapi", None)
    with pytest.raises(EnvironmentSetupError, match=r"'psycopg': pip install 'flinkish_spark\[postgres\]'"):
        PostgresSink.create("postgresql://u@h/db", "t", uid="out", schema=SCHEMA)
    with pytest.raises(EnvironmentSetupError, match=r"'adbc-driver-postgresql': pip install 'flinkish_spark\[postgres\]'"):
        from flinkish_spark.connectors.postgres.connection import adbc_connect

        adbc_connect(parse_url("postgresql://u@h/db"))


def test_commit_of_a_transaction_rolled_back_by_hand_is_a_terminal_error_naming_it(pg_url: str) -> None:
    import pyarrow as pa

    from flinkish_spark.errors import CommitFailedError
    from flinkish_spark.sink.protocol import PrepareContext

    schema = StructType([StructField("id", LongType())])
    rows = pa.RecordBatch.from_pydict({"id": pa.array([1, 2], pa.int64())})
    sink = PostgresSink.create(pg_url, "t", uid="out", schema=schema, create_table=True, commit_mode="prepared")
    done = sink.prepare(iter([rows]), PrepareContext("out", 0, 0, 0))
    lost = sink.prepare(iter([rows]), PrepareContext("out", 1, 0, 0))
    assert done is not None and lost is not None
    assert sink.commit([done], 0) == "COMMITTED" and sink.commit([done], 0) == "COMMITTED"  # gone + recorded = done
    q(pg_url, f"ROLLBACK PREPARED '{lost.gid}'")
    with pytest.raises(CommitFailedError, match=f"prepared transaction '{lost.gid}' is gone.*no record of its commit"):
        sink.commit([lost], 1)
    staged = PostgresSink.create(pg_url, "t", uid="st", schema=schema, commit_mode="staged")
    c = staged.prepare(iter([rows]), PrepareContext("st", 0, 0, 0))
    assert c is not None
    q(pg_url, f"DELETE FROM {staged.plan.staging}")
    with pytest.raises(CommitFailedError, match="holds 0 of the epoch's 2 decided rows"):
        staged.commit([c], 0)
    assert q(pg_url, "SELECT count(*) FROM t") == [(2,)]
