"""The flinkish command as a user runs it: inspect (local and S3) and the demos (mirror, the default, and files)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.checkpoint.store import SourceCheckpointStore
from flinkish_spark.io.fileio import FileIO


def write_epochs(io: FileIO, root: str) -> None:
    store = SourceCheckpointStore(io, root, "orders", "flinkish.files")
    splits_by_epoch = [
        (SplitRecord("a", 0, 1, 1, True, 0), SplitRecord("b", 0, 0, 1)),
        (SplitRecord("a", 1, 1, 1, True, 0), SplitRecord("b", 0, 1, 1, True, 1)),
    ]
    for i, splits in enumerate(splits_by_epoch):
        store.write(SourceCheckpoint("orders", "flinkish.files", i, i - 1 if i else None, 0, "{}", b"", True, splits))


def flinkish(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flinkish_spark.cli", *args], capture_output=True, text=True, timeout=120)


def test_inspect_local_table_and_json(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    write_epochs(FileIO.for_url(root), root)
    table = flinkish("inspect", root)
    assert table.returncode == 0, table.stderr
    assert "orders" in table.stdout and "PARTIALLY_FINISHED" in table.stdout and "FINISHED" in table.stdout
    assert "1/2" in table.stdout and "2/2" in table.stdout
    data = json.loads(flinkish("inspect", root, "--json").stdout)
    assert [(s["ckpt_id"], s["status"], s["splits_finished"]) for s in data["sources"]] == [
        (0, "PARTIALLY_FINISHED", 1),
        (1, "FINISHED", 2),
    ]


@pytest.mark.s3
def test_inspect_s3(s3: str) -> None:
    write_epochs(FileIO.for_url("s3://test", {"endpoint_url": s3}), "s3://test/meta")
    out = flinkish("inspect", "s3://test/meta", "--json", "--endpoint-url", s3)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["sources"][-1]["status"] == "FINISHED"


def test_inspect_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    out = flinkish("inspect", str(tmp_path / "nope"))
    assert out.returncode == 2 and "does not exist: pass the metadata root" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("remote", [False, True], ids=["local", "remote"])
def test_demo_runs_and_reports_exactly_once(tmp_path: Path, remote: bool) -> None:
    """The files demo (``--pipeline files``). --remote: the pipeline runs in a Spark Connect server of its own
    process, whose kill -9 is step 2."""
    out = subprocess.run(
        [sys.executable, "-m", "flinkish_spark.cli", "demo", "--pipeline", "files", "--workdir", str(tmp_path / "demo"),
         *(["--remote"] if remote else [])],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = " ".join(out.stdout.split())  # the console wraps its lines
    assert ("Connect server exit: killed by SIGKILL" if remote else "driver exit: killed by SIGKILL") in text, text[-3000:]
    if remote:  # the client ends by itself, with one clear error naming its server
        assert "the Connect client gave up on its dead server" in text and "ConnectServerUnavailableError: the Spark " \
            "Connect server sc://127.0.0.1:" in text, text[-3000:]
    assert "holds 5000 rows, 5000 distinct" in text
    assert "the query ended by itself (finished)" in text
    assert "demo OK: 5000 rows exactly once despite kill -9 mid-commit" in text


@pytest.mark.slow
def test_mirror_demo_survives_a_kill_mid_commit_a_new_column_and_a_new_table_and_ends_equal(tmp_path: Path) -> None:
    """The default demo: flinkish mirror of the embedded shop database into local Delta tables."""
    import deltalake

    workdir = tmp_path / "demo"
    out = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "demo", "--workdir", str(workdir)],
                         capture_output=True, text=True, timeout=600)
    text = " ".join(out.stdout.split())  # the console wraps its lines
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "flinkish mirror exit 137" in text and "its driver was killed by SIGKILL mid-commit" in text, text[-4000:]
    assert "run the same command again: it continues from the checkpoint" in text  # the command's own words
    assert "tables snapshotted 4/4" in text and "flinkish mirror: drained" in text
    for table in ("public.customers", "public.orders", "public.products", "public.reviews"):
        assert re.search(rf"{table} │ +\d+ │ +\d+ │ OK", text), text[-3000:]
    assert "demo OK: 4 tables equal to their source" in text
    command = next(ln for ln in out.stdout.splitlines() if ln.startswith("3. flinkish mirror"))  # one line, to copy
    assert command.endswith("--source-option discoveryInterval=1"), out.stdout[:3000]
    customers = deltalake.DeltaTable(str(workdir / "lake" / "public" / "customers"))
    assert "tier" in [f.name for f in customers.schema().fields]  # the column added while it ran


def test_mirror_demo_refuses_remote() -> None:
    out = flinkish("demo", "--pipeline", "mirror", "--remote")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--remote runs the files demo through Spark Connect" in out.stderr


@pytest.mark.s3
def test_inspect_a_real_pipeline_on_s3_shows_source_status_and_sink_commits(spark, s3: str, tmp_path: Path) -> None:
    import flinkish_spark

    df = (spark.readStream.format("flinkish.sequence").option("uid", "seq").option("checkpoint", "s3://test/meta")
          .option("endpointUrl", s3).option("rowsPerSplit", "10,100").option("maxRowsPerTrigger", "40").load())
    q = (df.writeStream.format("flinkish.parquet").option("uid", "out").option("path", "s3://test/out")
         .option("checkpoint", "s3://test/meta").option("endpointUrl", s3)
         .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="1 second").start())
    assert flinkish_spark.await_finished(q, timeout=120) == "finished"
    data = json.loads(flinkish("inspect", "s3://test/meta", "--json", "--endpoint-url", s3).stdout)
    statuses = [s["status"] for s in data["sources"]]
    assert statuses[0] == "PARTIALLY_FINISHED" and statuses[-1] == "FINISHED"
    assert data["sources"][-1]["splits_finished"] == data["sources"][-1]["splits_total"] == 2
    assert {s["uid"] for s in data["sinks"]} == {"out"} and all(s["state"] == "committed" for s in data["sinks"])
    table = flinkish("inspect", "s3://test/meta", "--endpoint-url", s3).stdout
    assert "FINISHED" in table and "committed" in table and "2/2" in table


def test_stop_without_a_running_query_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    write_epochs(FileIO.for_url(root), root)  # a checkpoint, but no live lease
    before = sorted(p.name for p in (tmp_path / "meta" / "sources" / "orders").iterdir())
    out = flinkish("stop", "--drain", root)
    assert out.returncode == 2 and "no running flinkish source under" in out.stderr
    assert sorted(p.name for p in (tmp_path / "meta" / "sources" / "orders").iterdir()) == before


def test_inspect_of_a_postgres_source_shows_wal_bytes_chunks_and_the_lsn_as_postgres_prints_it(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    store = SourceCheckpointStore(FileIO.for_url(root), root, "mirror", "flinkish.postgres")
    lsn = (1 << 32) + 0x6B3F1A0  # 1/6B3F1A0
    splits = (SplitRecord("snapshot-0-t0-00000", 0, 1, 1, True, 0), SplitRecord("snapshot-0-t0-00001", 0, 0, 1),
              SplitRecord("changes-0", lsn - 4096, lsn))
    store.write(SourceCheckpoint("mirror", "flinkish.postgres", 0, None, 0, "{}", b"", False, splits))
    table = flinkish("inspect", "--checkpoint", root)  # --checkpoint as in every other command
    assert table.returncode == 0, table.stderr
    assert "LSN 1/6B3F1A0" in table.stdout and "1 chunks, 4096 B of WAL" in table.stdout, table.stdout
    assert "rows in epoch" not in table.stdout and str(lsn) not in table.stdout
    data = json.loads(flinkish("inspect", root, "--json").stdout)["sources"][0]
    assert (data["lsn"], data["wal_bytes_in_epoch"], data["chunks_in_epoch"]) == ("1/6B3F1A0", 4096, 1)


def test_help_version_and_the_checkpoint_spelled_either_way() -> None:
    top = flinkish("--help")
    assert top.returncode == 0 and "``" not in top.stdout and ":mod:" not in top.stdout, top.stdout
    assert "mirror compare" in top.stdout
    version = flinkish("--version")
    assert version.returncode == 0 and re.fullmatch(r"flinkish \d+\.\d+\.\d+\S*\n", version.stdout), version.stdout
    for command in ("inspect", "stop", "jvm-archive"):
        usage = flinkish(command, "--help").stdout
        description = usage.split("\n\n")[1]  # after the usage paragraph
        assert not description.startswith(("positional arguments", "options")), usage
    both = flinkish("stop", "/a", "--checkpoint", "/b")
    assert both.returncode == 2 and "two metadata roots" in both.stderr
    none = flinkish("stop")
    assert none.returncode == 2 and "the metadata root is missing" in none.stderr


def test_stop_takes_checkpoint_as_an_option_too(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    write_epochs(FileIO.for_url(root), root)
    out = flinkish("stop", "--checkpoint", root)
    assert out.returncode == 2 and f"no running flinkish source under {root}" in out.stderr


def test_the_command_exits_with_its_code_after_its_threads_atexit_handlers_and_output() -> None:
    """`flinkish` leaves with os._exit (native thread pools can abort CPython's finalization:
    apache/arrow#34314); what Python's own exit does must still happen: buffered output written,
    atexit handlers run, non-daemon threads finished, the command's code (and argparse's) kept."""
    script = ("import atexit, sys, threading, time\n"
              "from flinkish_spark import cli\n"
              "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
              "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done', end=''))).start()\n"
              "cli.main = lambda: (print('no newline yet', end=''), 7)[1]\n"
              "cli.entry()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (7, "no newline yetthread done", "atexit ran\n")
    usage = subprocess.run([sys.executable, "-m", "flinkish_spark.cli", "no-such-command"], capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode == 2 and "invalid choice: 'no-such-command'" in usage.stderr


def test_the_command_ends_although_a_library_left_its_thread_pool_open() -> None:
    """A library's executor that is never shut down (pyiceberg's shared one: `flinkish mirror compare --format
    iceberg` printed its answer, then waited for ever): its queued work is done and its idle workers end, as at
    Python's own exit -- the command does not hang."""
    script = ("import concurrent.futures, time\n"
              "from flinkish_spark import cli\n"
              "pool = concurrent.futures.ThreadPoolExecutor(2)\n"
              "cli.main = lambda: (pool.submit(lambda: (time.sleep(0.3), print('queued work done', end=''))), 3)[1]\n"
              "cli.entry()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (3, "queued work done", "")
