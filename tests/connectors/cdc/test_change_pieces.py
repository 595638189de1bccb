"""An epoch's change range cut into the pieces its checkpoint names (no Spark): each piece a partition of its own,
the same pieces from the same checkpoint (a replay), a range the record does not name exactly left whole."""

from __future__ import annotations

import json
import types
from typing import Any

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.connectors.cdc.change_split import epoch_pieces
from flinkish_spark.connectors.cdc.datasource import CdcDataSource
from flinkish_spark.source.planning import ReadRange


def _ckpt(state: dict, *records: SplitRecord) -> SourceCheckpoint:
    return SourceCheckpoint("src", "flinkish.mysql", 3, 2, 0, "{}", json.dumps(state).encode(), False, records)


def test_the_change_range_is_cut_where_the_checkpoint_says_and_chunks_stay_grouped() -> None:
    change = SplitRecord("changes-0", 0, 900, None, False, None, '{"start": 100}')
    chunks = [SplitRecord(f"snapshot-0-t0-{i:05d}", 0, 1, 1, True, 3, "{}") for i in range(3)]
    state = {"generation": 0, "pieces": {"split": "changes-0", "start": 0, "end": 900, "cuts": [400, 700]}}
    ckpt = _ckpt(state, change, *chunks)
    ranges = epoch_pieces([ReadRange(r.split_id, r.payload, r.start, r.position) for r in ckpt.splits],
                          ckpt.enumerator_state)
    assert [(r.split_id, r.start, r.end) for r in ranges if r.split_id == "changes-0"] == [
        ("changes-0", 0, 400), ("changes-0", 400, 700), ("changes-0", 700, 900)]
    assert all(r.payload == '{"start": 100}' for r in ranges if r.split_id == "changes-0")

    source: Any = types.SimpleNamespace(snapshot_partitions=2)  # only the grouping: no options
    source.group_ranges = CdcDataSource.group_ranges.__get__(source)
    source.epoch_ranges = CdcDataSource.epoch_ranges.__get__(source)
    groups = source.group_ranges(source.epoch_ranges(ckpt))
    assert [[(r.start, r.end) for r in g] for g in groups[:3]] == [[(0, 400)], [(400, 700)], [(700, 900)]]
    assert [len(g) for g in groups[3:]] == [1, 2]  # the chunks in snapshotPartitions tasks
    assert source.epoch_ranges(ckpt) == source.epoch_ranges(ckpt)  # a replay: the same pieces


def test_a_range_the_record_does_not_name_stays_whole() -> None:
    change = SplitRecord("changes-1", 500, 900, None, False, None, None)
    for pieces in ({"split": "changes-1", "start": 0, "end": 900, "cuts": [700]},  # another range of the split
                   {"split": "changes-0", "start": 500, "end": 900, "cuts": [700]}):  # another generation's
        ckpt = _ckpt({"pieces": pieces}, change)
        assert epoch_pieces([ReadRange("changes-1", None, 500, 900)], ckpt.enumerator_state) == [
            ReadRange("changes-1", None, 500, 900)]
    assert epoch_pieces([ReadRange("changes-1", None, 500, 900)], b"") == [ReadRange("changes-1", None, 500, 900)]
