"""Put-if-absent on S3 when the network or a concurrent writer gets in the way (moto behind a faulty proxy).

* A lost answer: the conditional PUT lands, its answer never arrives, the client's own retry
  meets ``412 PreconditionFailed``. That is our write: it must count as written, not as
  "someone else wrote it" (which the checkpoint store reports as another running query).
* ``409 ConditionalRequestConflict``: S3's answer while another conditional write of the key
  is in flight. Retried: the retry either writes or finds the other writer's object (then
  "taken": a Delta commit reads the winner and takes the next version).
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from flinkish_spark.errors import AlreadyExistsError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.testing.faulty_s3 import Fault, FaultyS3Proxy

pytestmark = pytest.mark.s3


def io_for(endpoint: str) -> FileIO:
    return FileIO.for_url("s3://test", storage_options_from({"endpointUrl": endpoint}, "s3://test"))


def test_a_lost_answer_is_our_own_write(s3: str) -> None:
    with FaultyS3Proxy(s3) as proxy:
        fault = proxy.arm(Fault("drop_answer", "PUT", "/test/meta/a.bin"))
        io = io_for(proxy.endpoint)
        io.write_exclusive("s3://test/meta/a.bin", b"ours")
        assert fault.hits == 1
        puts = [s for s in proxy.seen if s.method == "PUT" and s.path.startswith("/test/meta/a.bin")]
        assert [s.status for s in puts] == [None, 412]  # the answer was lost, the client's retry met our object
    assert io_for(s3).read_bytes("s3://test/meta/a.bin") == b"ours"


def test_another_writers_object_is_still_taken(s3: str) -> None:
    io_for(s3).write_exclusive("s3://test/meta/a.bin", b"theirs")
    with FaultyS3Proxy(s3) as proxy:
        proxy.arm(Fault("drop_answer", "PUT", "/test/meta/a.bin"))
        with pytest.raises(AlreadyExistsError):
            io_for(proxy.endpoint).write_exclusive("s3://test/meta/a.bin", b"ours")
    assert io_for(s3).read_bytes("s3://test/meta/a.bin") == b"theirs"


def test_a_lost_answer_is_no_second_query_for_the_checkpoint_store(s3: str) -> None:
    """What a user saw: a source failing with "Another query is running" after one lost answer."""
    from flinkish_spark.checkpoint.model import SourceCheckpoint
    from flinkish_spark.checkpoint.store import SourceCheckpointStore

    with FaultyS3Proxy(s3) as proxy:
        proxy.arm(Fault("drop_answer", "PUT", ".parquet"))
        store = SourceCheckpointStore(io_for(proxy.endpoint), "s3://test/meta", "src", "sequence")
        ckpt = SourceCheckpoint(uid="src", kind="sequence", ckpt_id=store.allocate_id(), parent_id=None,
                                created_ms=int(time.time() * 1000), config="{}", enumerator_state=b"", no_more_splits=True)
        store.write(ckpt)
    assert SourceCheckpointStore(io_for(s3), "s3://test/meta", "src", "sequence").latest() == ckpt


def test_a_409_conflict_is_retried(s3: str) -> None:
    with FaultyS3Proxy(s3) as proxy:
        fault = proxy.arm(Fault("conflict", "PUT", "/test/meta/b.bin"))
        io_for(proxy.endpoint).write_exclusive("s3://test/meta/b.bin", b"ours")
        assert fault.hits == 1
    assert io_for(s3).read_bytes("s3://test/meta/b.bin") == b"ours"


def test_a_409_conflict_whose_other_writer_won_is_taken(s3: str) -> None:
    with FaultyS3Proxy(s3) as proxy:
        # The other writer's PUT completes while ours is refused with 409.
        proxy.arm(Fault("conflict", "PUT", "/test/meta/c.bin",
                        before_answer=lambda: io_for(s3).write_exclusive("s3://test/meta/c.bin", b"theirs")))
        with pytest.raises(AlreadyExistsError):
            io_for(proxy.endpoint).write_exclusive("s3://test/meta/c.bin", b"ours")
    assert io_for(s3).read_bytes("s3://test/meta/c.bin") == b"theirs"


def test_delta_commit_after_a_409_from_a_concurrent_writer_takes_the_next_version(s3_proc: str) -> None:
    deltalake = pytest.importorskip("deltalake")
    from pyspark.sql.types import LongType, StructField, StructType

    from flinkish_spark.connectors.delta import DeltaSink
    from flinkish_spark.sink.protocol import PrepareContext

    direct = {"AWS_ENDPOINT_URL": s3_proc, "AWS_ALLOW_HTTP": "true", "conditional_put": "etag"}
    schema = StructType([StructField("seq", LongType())])
    with FaultyS3Proxy(s3_proc) as proxy:
        sink = DeltaSink.at("s3://test/t", uid="u", schema=schema, options={"endpointUrl": proxy.endpoint})
        other = pa.table({"seq": pa.array([100], pa.int64())})
        proxy.arm(Fault("conflict", "PUT", "/_delta_log/00000000000000000001.json", before_answer=lambda: deltalake.write_deltalake(
            "s3://test/t", other, mode="append", storage_options=direct)))
        batch = pa.RecordBatch.from_pydict({"seq": pa.array([1, 2], pa.int64())})
        prepared = sink.prepare(iter([batch]), PrepareContext("u", 0, 0, 0))
        assert sink.commit([prepared], 0) == "COMMITTED"
    table = deltalake.DeltaTable("s3://test/t", storage_options=direct)
    assert table.version() == 2 and table.transaction_version("u") == 0
    assert sorted(table.to_pyarrow_table()["seq"].to_pylist()) == [1, 2, 100]
