"""flinkish.delta mode=upsert under kill -9 at every point of the keyed commit, on S3 (moto in its own process).

A bounded change stream -- two sequence splits made into changes: every other change hits one of
20 hot keys (each changed several times per epoch), the others sweep 200 cold keys (so an
epoch replaces only some rows of earlier files: deletion vectors); one change in nine is a
delete -- runs in child
drivers killed at each point of the keyed commit in turn, every task's first attempt
failing; then a last run finishes. The table read by delta-rs must hold each key's last
change, every epoch must be committed exactly once, and nothing on storage may be
unreferenced by the log.

No kill after the commit (``sink.after_commit``): there the decision log already says done, so the
restart's commit_epoch never reaches the keyed sink's commit (ALREADY_COMMITTED, the replay's files
aborted -- as after the kill at ``delta.keyed.before_version``); the append matrix
(test_crash.py) checks that point for Delta.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog
from flinkish_spark.testing.delta_log import log_mentions, unreferenced

deltalake = pytest.importorskip("deltalake")
pytestmark = [pytest.mark.slow, pytest.mark.s3]

LENGTHS = [600, 450]
HOT, COLD = 20, 200
# Run k is killed at its point's 2nd hit: in epoch 1 (the first epoch's files replace nothing).
CHAIN = ["sink.before_decision", "delta.keyed.before_version", "sink.before_done"]
CHANGES = [  # split s, sequence number seq -> a change of key(seq) * 2 + s
    f"CAST((CASE WHEN seq % 2 = 0 THEN seq % {HOT} ELSE 1000 + seq % {COLD} END) * 2 + split AS BIGINT) AS id",
    "concat('v', seq) AS v", "CAST(seq AS INT) AS n",
    "CASE WHEN seq % 9 = 4 THEN 'd' ELSE 'u' END AS _op", "CAST(seq AS BIGINT) AS _lsn",
    "CAST(NULL AS TIMESTAMP) AS _commit_ts",
]


def expected() -> list[tuple]:
    last: dict[int, tuple | None] = {}
    for split, length in enumerate(LENGTHS):
        for seq in range(length):
            key = (seq % HOT if seq % 2 == 0 else 1000 + seq % COLD) * 2 + split
            last[key] = None if seq % 9 == 4 else (key, f"v{seq}", seq)
    return sorted(v for v in last.values() if v is not None)


def spec(tmp_path: Path, endpoint: str) -> dict:
    return {
        "source": {"format": "flinkish.sequence", "options": {
            "uid": "seq", "checkpoint": "s3://test/meta", "rowsPerSplit": ",".join(map(str, LENGTHS)),
            "maxRowsPerTrigger": 150, "endpointUrl": endpoint}},
        "select": CHANGES,
        "sink": {"format": "flinkish.delta", "checkpointLocation": str(tmp_path / "cp"), "options": {
            "uid": "out", "path": "s3://test/table", "mode": "upsert", "key": "id", "deletes": "true",
            "checkpointInterval": 3, "compactEvery": 4, "rowsPerFile": 50, "endpointUrl": endpoint}},
        "master": "local[2,4]",
    }


def test_crash_matrix_in_upsert_mode_on_s3(run_pipeline, s3_proc: str, tmp_path: Path) -> None:
    options = {"AWS_ENDPOINT_URL": s3_proc, "AWS_ALLOW_HTTP": "true"}
    io = FileIO.for_url("s3://test", {"endpoint_url": s3_proc})
    log = DecisionLog(FileIO.for_url(str(tmp_path)), str(tmp_path / "cp" / "flinkish"), "out")
    env = {"FLINKISH_FAIL_AT": "sink.write:first"}

    def txn() -> int:
        try:
            v = deltalake.DeltaTable("s3://test/table", storage_options=options).transaction_version("out")
        except deltalake.exceptions.TableNotFoundError:
            return -1
        return -1 if v is None else v

    for epoch, point in enumerate(CHAIN, start=1):
        run = run_pipeline(spec(tmp_path, s3_proc), crash_at=f"{point}:2", env=env)
        assert run.killed, f"no kill at {point}: {run.output[-3000:]}"
        decided, done = log.epochs()
        if point == "sink.before_decision":
            assert epoch not in decided and txn() == epoch - 1
        elif point == "delta.keyed.before_version":  # decided; files and deletion vectors written, no version
            assert epoch in decided and txn() == epoch - 1
        else:  # sink.before_done
            assert epoch not in done and txn() == epoch
    last = run_pipeline(spec(tmp_path, s3_proc), env=env)
    assert last.returncode == 0, last.output[-3000:]
    table = deltalake.DeltaTable("s3://test/table", storage_options=options)
    rows = sorted((r["id"], r["v"], r["n"]) for r in pa.table(table.scan()).to_pylist())
    assert rows == expected()
    epochs = sorted(int(h["flinkish.epoch"]) for h in table.history() if h.get("flinkish.uid") == "out" and "flinkish.epoch" in h)
    assert epochs == list(range(7))  # 1,050 changes at 150 per epoch, each epoch exactly once
    assert log_mentions(io, "s3://test/table", '"deletionVector"')  # replaced rows were marked, not rewritten
    assert unreferenced(io, "s3://test/table") == set()
