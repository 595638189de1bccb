"""FileIO: put-if-absent on every backend, error mapping, pickling."""

from __future__ import annotations

import pickle
import threading
from typing import Callable

import pytest

from flinkish_spark.errors import AlreadyExistsError, ConfigError, StorageAccessError, StorageUnavailableError
from flinkish_spark.io.fileio import FileIO, storage_options_from


def _backends(tmp_path, s3) -> dict[str, tuple[FileIO, str]]:
    return {
        "local": (FileIO.for_url(str(tmp_path)), str(tmp_path / "root")),
        "memory": (FileIO.for_url("memory://x"), f"memory://fileio-{tmp_path.name}"),
        "s3": (FileIO.for_url("s3://test", {"endpoint_url": s3}), "s3://test/root"),
    }


@pytest.mark.parametrize("backend", ["local", "memory", "s3"])
def test_exclusive_create_has_exactly_one_winner(backend: str, tmp_path, s3: str) -> None:
    io, root = _backends(tmp_path, s3)[backend]
    path = f"{root}/ckpt/000000000001.parquet"
    results: list[str] = []

    def writer(tag: bytes) -> Callable[[], None]:
        def go() -> None:
            try:
                io.write_exclusive(path, tag * 1000)
                results.append("won")
            except AlreadyExistsError:
                results.append("lost")

        return go

    threads = [threading.Thread(target=writer(bytes([65 + i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["lost", "lost", "lost", "won"]
    data = io.read_bytes(path)
    assert len(data) == 1000 and len(set(data)) == 1  # one writer's whole file, never a mix
    assert io.list_names(f"{root}/ckpt") == ["000000000001.parquet"]


def test_local_exclusive_write_leaves_no_temporary_files(tmp_path) -> None:
    io = FileIO.for_url(str(tmp_path))
    io.write_exclusive(str(tmp_path / "d" / "a"), b"1")
    with pytest.raises(AlreadyExistsError):
        io.write_exclusive(str(tmp_path / "d" / "a"), b"2")
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["a"]
    assert io.read_bytes(str(tmp_path / "d" / "a")) == b"1"


def test_fileio_pickles_without_its_filesystem(s3: str) -> None:
    io = FileIO.for_url("s3://test/x", {"endpoint_url": s3})
    io.write_bytes("s3://test/x/a", b"hello")
    clone = pickle.loads(pickle.dumps(io))
    assert clone._fs is None and clone.read_bytes("s3://test/x/a") == b"hello"


def test_unreachable_endpoint_is_a_retryable_error_naming_it() -> None:
    io = FileIO.for_url("s3://test", {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}}, )
    io.retries = 1
    with pytest.raises(StorageUnavailableError, match=r"http://127\.0\.0\.1:9") as err:
        io.check_writable_root("s3://test/meta", "option 'checkpoint'")
    assert err.value.retryable


def test_missing_bucket_is_an_access_error(s3: str) -> None:
    io = FileIO.for_url("s3://nope", {"endpoint_url": s3})
    with pytest.raises(StorageAccessError, match="bucket 'nope' does not exist"):
        io.check_writable_root("s3://nope/meta", "option 'checkpoint'")


def test_root_below_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "afile").write_text("x")
    io = FileIO.for_url(str(tmp_path))
    with pytest.raises(StorageAccessError, match="not a writable directory"):
        io.check_writable_root(str(tmp_path / "afile" / "meta"), "option 'checkpoint'")


def test_storage_options_come_from_options_then_environment(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    assert storage_options_from({}, "s3://b/x")["endpoint_url"] == "http://env:1"
    assert storage_options_from({"endpointUrl": "http://opt:2"}, "s3://b/x")["endpoint_url"] == "http://opt:2"
    assert storage_options_from({}, "/local/x") == {}
    with pytest.raises(ConfigError, match="'storageOptions' is not valid JSON"):
        storage_options_from({"storageOptions": "{nope"}, "s3://b/x")
    with pytest.raises(ConfigError, match="'endpointUrl' must be an http"):
        storage_options_from({"endpointUrl": "localhost:9000"}, "s3://b/x")


def test_unknown_protocol_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown protocol 'nosuch'"):
        FileIO.for_url("nosuch://x", what="option 'checkpoint'")


def test_missing_credentials_are_an_access_error_naming_the_fix(s3: str, monkeypatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    io = FileIO.for_url("s3://test", {"endpoint_url": s3, "config_kwargs": {"connect_timeout": 2}})  # its own client
    with pytest.raises(StorageAccessError, match="no S3 credentials were found. Set AWS_ACCESS_KEY_ID"):
        io.check_writable_root("s3://test/meta", "option 'checkpoint'")


def test_fileios_share_one_client_that_never_answers_from_a_stale_listing(s3: str) -> None:
    a = FileIO.for_url("s3://test", {"endpoint_url": s3})
    b = pickle.loads(pickle.dumps(FileIO.for_url("s3://test", {"endpoint_url": s3})))
    assert a.fs is b.fs  # one S3 client per process and storage options
    a.write_bytes("s3://test/d/f", b"1")
    assert b.list_names("s3://test/d") == ["f"] and b.size("s3://test/d/f") == 1
    a.write_bytes("s3://test/d/f", b"12345")  # rewritten after b listed it
    assert b.size("s3://test/d/f") == 5 and b.read_bytes("s3://test/d/f") == b"12345"


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_find_and_glob_answer_files_only(backend: str, tmp_path, s3: str) -> None:
    io, root = _backends(tmp_path, s3)[backend]
    for name in ("in/day=1/a.parquet", "in/day=1/b.parquet", "in/day=2/c.parquet", "in/top.parquet"):
        io.write_bytes(f"{root}/{name}", b"x")
    if backend == "s3":  # a folder placeholder, as the S3 console and some tools create
        io.fs.pipe_file("test/root/in/day=2/", b"")

    def rel(paths: list[str]) -> list[str]:
        return [p.split("/in/", 1)[1] for p in paths]

    assert rel(io.find(f"{root}/in")) == ["day=1/a.parquet", "day=1/b.parquet", "day=2/c.parquet", "top.parquet"]
    assert rel(io.find(f"{root}/in/top.parquet")) == ["top.parquet"]  # a file path is itself
    assert io.find(f"{root}/missing") == []
    assert rel(io.glob(f"{root}/in/day=*")) == ["day=1/a.parquet", "day=1/b.parquet", "day=2/c.parquet"]  # matching folders expand
    assert rel(io.glob(f"{root}/in/day=1/*.parquet")) == ["day=1/a.parquet", "day=1/b.parquet"]
    # Every object below the prefix gone: the prefix is not a file either (the race that
    # once made flinkish.files read its own input folder as a 0-byte Parquet file).
    for p in io.find(f"{root}/in"):
        io.delete(io.url(p))
    assert io.find(f"{root}/in") == []


def _s3_error(code: str, status: int, message: str, operation: str = "GetObject") -> OSError:
    """The exception s3fs raises for an S3 error answer: botocore's ClientError translated to an OSError."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    error = ClientError({"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation)
    return translate_boto_error(error)


def test_a_status_code_in_a_path_is_not_a_transient_failure(tmp_path) -> None:
    """'503' or '500' in a path (epoch 503, a table named m500) is no status code: a permanent
    error on that path is raised at once, as itself, never retried and reported as an endpoint
    that did not answer; S3's real transient answers (503 SlowDown, 500 InternalError, a bare
    503) are retried."""
    io = FileIO.for_url(str(tmp_path))
    epoch_dir = tmp_path / "m500" / "_delta_log" / "00000000000000000503.json"
    epoch_dir.mkdir(parents=True)  # a directory where a file is read: a permanent error
    with pytest.raises(IsADirectoryError, match="503"):
        io.read_bytes(str(epoch_dir))

    calls: list[int] = []

    def failing(exc: BaseException, times: int) -> Callable[[], bytes]:
        def go() -> bytes:
            calls.append(1)
            if len(calls) <= times:
                raise exc
            return b"ok"

        return go

    permanent = _s3_error("InvalidArgument", 400, "Invalid argument for key t/m503/_delta_log/00000000000000000503.json")
    with pytest.raises(OSError, match="Invalid argument") as err:
        io._call("reading", "s3://b/t/m503/_delta_log/00000000000000000503.json", failing(permanent, 1))
    assert not isinstance(err.value, StorageUnavailableError) and len(calls) == 1

    io.retries = 2
    for code, status in (("SlowDown", 503), ("ServiceUnavailable", 503), ("InternalError", 500), ("503", 503)):
        calls.clear()
        transient = _s3_error(code, status, "Please reduce your request rate.", "PutObject")
        assert io._call("writing", "s3://b/t/x.json", failing(transient, 2)) == b"ok" and len(calls) == 3, code
        calls.clear()
        with pytest.raises(StorageUnavailableError, match="did not answer"):
            io._call("writing", "s3://b/t/x.json", failing(transient, 3))


def test_a_local_write_in_progress_is_hidden_from_a_listing_of_its_folder(tmp_path, monkeypatch) -> None:
    """A reader listing a folder while a file is written (the newest registry version, a decision) must never see
    the half-written temporary file under a name with the real one's prefix: it would read a file about to vanish
    (test_ddl_mirror hit it: FileNotFoundError on ``v00000003-....json.tmp-<uuid>``)."""
    import os

    io = FileIO.for_url(str(tmp_path))
    seen: list[str] = []
    real = os.replace

    def spy(src: str, dst: str) -> None:
        seen.extend(io.list_names(str(tmp_path)))
        real(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    io.write_bytes(str(tmp_path / "v00000001-abc.json"), b"{}")
    assert seen and [n for n in seen if not n.startswith(".")] == []  # only a hidden temporary name
    assert io.list_names(str(tmp_path)) == ["v00000001-abc.json"]
