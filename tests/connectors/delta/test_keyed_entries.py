"""flinkish.delta keyed: a task's key entries in a file beside its data files (in process, no Spark).

The committable (and so the decision record) names the file with its size, rows and CRC; what happens at each
protocol point is played through prepare / encode (the record) / decode (a restart) / commit / cleanup, as the
driver does it after a kill -9 there: the files on storage are all a killed process leaves behind. Real kills of
the mirror path with entries files: tests/mirror/test_big_transaction.py.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.connectors.lakehouse import entries_file
from flinkish_spark.errors import CorruptMetadataError
from flinkish_spark.testing.changes import Change, Model, prepare, random_epochs

deltalake = pytest.importorskip("deltalake")

from tests.connectors.delta.test_keyed import read_table, sink_at, stray_files  # noqa: E402


def entries_files(path: Path) -> list[Path]:
    return sorted(path.rglob(f"*{entries_file.SUFFIX}"))


@pytest.fixture
def in_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every task's entries in a file (in production: above 1 MiB of entries)."""
    monkeypatch.setattr(entries_file, "INLINE_MAX_BYTES", 0)


def test_entries_travel_in_a_file_and_the_record_names_it(tmp_path: Path, in_files: None) -> None:
    path = tmp_path / "t"
    sink = sink_at(path)
    model = Model("upsert", "true")
    for epoch, changes in enumerate(random_epochs(seed=5, epochs=4, keys=60, per_epoch=80, tasks=3)):
        prepared = [c for c in prepare(sink, epoch, changes) if c is not None]
        assert all(c.entries == b"" and c.entries_file is not None for c in prepared)
        assert len(entries_files(path)) == len(prepared)  # beside the data files, before any commit
        records = [sink.encode(c) for c in prepared]
        assert all(r.startswith(b"FKD2") and len(r) < 2048 for r in records)  # a path, not the keys
        decided = [sink.decode(r) for r in records]
        assert decided == prepared
        assert sink.commit(decided, epoch) == "COMMITTED"
        sink.cleanup(epoch, decided)
        model.apply(changes)
        assert read_table(str(path)) == model.table(), f"epoch {epoch}"
        assert entries_files(path) == []  # the epoch is done: no commit reads them again
    assert stray_files(path) == set()


def test_a_lost_attempt_and_a_restart_after_the_decision(tmp_path: Path, in_files: None) -> None:
    """Attempt 0 wrote its files and entries file but its committable never reached the driver (killed after
    the prepare); attempt 1's is decided; the driver is killed after the decision, and after the version (before
    the done marker): each restart commits the decided committables from the record, reading the same file."""
    path = tmp_path / "t"
    sink = sink_at(path)
    first = [Change(k, "c", f"a{k}", 1) for k in range(50)]
    lost = prepare(sink, 0, first)
    again = prepare(sink, 0, first)
    assert len(entries_files(path)) == 2
    record = [sink.encode(c) for c in again]
    assert sink.commit([sink.decode(r) for r in record], 0) == "COMMITTED"  # killed after the version
    assert sink.commit([sink.decode(r) for r in record], 0) == "ALREADY_COMMITTED"  # the restart's commit
    sink.cleanup(0, [sink.decode(r) for r in record])
    assert entries_files(path) == [] and stray_files(path) == set()  # the lost attempt's file too
    assert lost[0].entries_file != again[0].entries_file  # a replay never overwrites a decided file
    # A decided epoch whose table holds it needs no entries: its file may be gone already.
    assert sink.commit([sink.decode(r) for r in record], 0) == "ALREADY_COMMITTED"
    assert sorted(read_table(str(path)), key=lambda r: r["id"]) == [{"id": k, "v": f"a{k}", "n": len(f"a{k}")} for k in range(50)]


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_damaged_entries_file_is_refused_and_nothing_is_visible(tmp_path: Path, in_files: None, damage: str) -> None:
    path = tmp_path / "t"
    sink = sink_at(path)
    prepared = prepare(sink, 0, [Change(k, "c", "x", 1) for k in range(20)])
    (file,) = entries_files(path)
    if damage == "truncated":
        file.write_bytes(file.read_bytes()[:-8])
        message = r"has \d+ bytes .* the record says \d+ .*truncated or replaced"
    else:
        file.unlink()
        message = "is missing"
    version = deltalake.DeltaTable(str(path)).version()
    with pytest.raises(CorruptMetadataError, match=message + r".*delete the epoch's commit record \(decisions/000000000000"):
        sink.commit(prepared, 0)
    assert deltalake.DeltaTable(str(path)).version() == version


def test_abort_removes_the_entries_file(tmp_path: Path, in_files: None) -> None:
    path = tmp_path / "t"
    sink = sink_at(path)
    prepared = prepare(sink, 0, [Change(k, "c", "x", 1) for k in range(20)])
    sink.abort(prepared, 0)
    assert entries_files(path) == [] and not list(path.rglob("*.parquet"))


def test_small_entries_stay_inline_and_records_of_the_previous_version_commit(tmp_path: Path) -> None:
    """Below the threshold the record is byte for byte what the versions before the entries files wrote (FKD1):
    a checkpoint of the previous version restores and its decided epoch commits."""
    path = tmp_path / "t"
    sink = sink_at(path)
    (c,) = prepare(sink, 0, [Change(k, "c", "x", 1) for k in range(20)])
    assert c.entries_file is None and entries_files(path) == []
    header = json.dumps({"partition": c.partition, "files": [[f.path, f.size, f.rows, [list(p) for p in f.partition_values],
                                                               f.stats] for f in c.files], "starts": list(c.starts)}).encode()
    previous = b"FKD1" + struct.pack(">I", len(header)) + header + c.entries  # the previous version's encoder
    assert sink.encode(c) == previous
    assert sink.commit([sink.decode(previous)], 0) == "COMMITTED"
    assert len(read_table(str(path))) == 20
    assert pa.ipc.open_stream(c.entries).read_all().num_rows == 20
