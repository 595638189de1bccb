"""What ``flinkish inspect`` shows of a ``flinkish.mysql`` checkpoint (no server: checkpoints as the source writes
them)."""

from __future__ import annotations

import json

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.inspect import SourceEpoch

START = 1 << 32 | 1000  # binlog file #1 at 1000: where the change split starts (its payload)


def ckpt(ckpt_id: int, record: SplitRecord, state: dict) -> SourceCheckpoint:
    return SourceCheckpoint("src", "flinkish.mysql", ckpt_id, ckpt_id - 1, 0, "{}", json.dumps(state).encode(),
                            False, (record,))


def test_the_first_change_epoch_counts_its_changes_not_the_positions_distance_from_0_and_shows_its_gtid() -> None:
    payload = json.dumps({"start": START})
    # The first change epoch: the split's record starts at 0, which stands for the start in its payload.
    first = ckpt(2, SplitRecord("changes-0", 0, START + 690, None, False, None, payload),
                 {"range": {"start": START, "end": START + 690, "changes": 3, "gtid": "0-1-12"}})
    e = SourceEpoch.of(first)
    assert e.rows_in_epoch == 3 and e.changes_in_epoch == 3
    assert e.read_in_epoch == "0 chunks, 3 changes"
    assert e.position == "binlog file #1 at 1690, GTID 0-1-12" and e.gtid == "0-1-12"
    # A later one; a checkpoint whose range record is of another range (a chunk-only epoch) counts no change.
    nxt = ckpt(3, SplitRecord("changes-0", START + 690, (2 << 32) | 4, None, False, None, payload),
               {"range": {"start": START + 690, "end": (2 << 32) | 4, "changes": 2, "gtid": "0-1-14"}})
    assert (SourceEpoch.of(nxt).rows_in_epoch, SourceEpoch.of(nxt).gtid) == (2, "0-1-14")
    stale = ckpt(4, SplitRecord("changes-0", (2 << 32) | 4, (2 << 32) | 4, None, False, None, payload),
                 {"range": {"start": START + 690, "end": (2 << 32) | 4, "changes": 2, "gtid": "0-1-14"}})
    assert SourceEpoch.of(stale).rows_in_epoch == 0 and SourceEpoch.of(stale).gtid == "0-1-14"
    # A checkpoint written before GTIDs were kept: the position alone, nothing counted from the distance.
    old = ckpt(2, SplitRecord("changes-0", 0, START + 690, None, False, None, payload), {})
    assert SourceEpoch.of(old).rows_in_epoch == 0 and SourceEpoch.of(old).position == "binlog file #1 at 1690"
    # A range planned without maxRowsPerTrigger: its rows were not counted (range_scan), its row events were.
    scanned = ckpt(2, SplitRecord("changes-0", 0, START + 690, None, False, None, payload),
                   {"range": {"start": START, "end": START + 690, "changes": None, "gtid": None, "events": 7,
                              "bytes": 650}})
    e = SourceEpoch.of(scanned)
    assert (e.changes_in_epoch, e.row_events_in_epoch, e.read_in_epoch) == (None, 7, "0 chunks, 7 row events")
