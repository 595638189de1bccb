"""Planning the next epoch: budgets, finishing, compaction of finished splits."""

from flinkish_spark.checkpoint.model import SourceCheckpoint, SplitRecord
from flinkish_spark.source.planning import Budget, plan_epoch, read_ranges
from flinkish_spark.source.split import Split, SplitExtent


def _ckpt(records, ckpt_id=1):
    return SourceCheckpoint("u", "k", ckpt_id, ckpt_id - 1, 0, "{}", b"", True, tuple(records))


def test_new_splits_are_planned_from_zero_and_short_split_finishes():
    extents = {"0": SplitExtent(10, 10), "1": SplitExtent(1000, 1000)}
    records, changed = plan_epoch((), [Split("0"), Split("1")], extents, Budget(max_units=100), ckpt_id=0)
    assert changed
    by_id = {r.split_id: r for r in records}
    assert (by_id["0"].start, by_id["0"].position, by_id["0"].finished, by_id["0"].finished_in) == (0, 10, True, 0)
    # the short split's unused share goes to the long one
    assert (by_id["1"].start, by_id["1"].position, by_id["1"].finished) == (0, 90, False)


def test_finished_split_is_compacted_and_never_read_again():
    first, _ = plan_epoch((), [Split("0", "p0"), Split("1", "p1")], {"0": SplitExtent(10, 10), "1": SplitExtent(50, 50)}, Budget(), 0)
    second, changed = plan_epoch(first, [], {}, Budget(), 1)
    assert not changed  # nothing live, nothing new
    assert all(r.finished and r.payload is None and r.start == r.position for r in second)
    assert read_ranges(_ckpt(second)) == []


def test_an_enumerator_that_forgets_finished_splits_gets_checkpoints_of_live_splits_only():
    first, _ = plan_epoch((), [Split("0", "p0"), Split("1", "p1")], {"0": SplitExtent(10, 10), "1": SplitExtent(5)}, Budget(), 0,
                          keep_finished=False)
    assert [(r.split_id, r.finished) for r in first] == [("0", True), ("1", False)]  # finishing here: still recorded
    second, _ = plan_epoch(first, [], {"1": SplitExtent(8)}, Budget(), 1, keep_finished=False)
    assert [(r.split_id, r.start, r.position) for r in second] == [("1", 5, 8)]  # finished earlier: left out


def test_unchanged_positions_report_no_change():
    first, _ = plan_epoch((), [Split("a")], {"a": SplitExtent(5)}, Budget(), 0)
    again, changed = plan_epoch(first, [], {"a": SplitExtent(5)}, Budget(), 1)
    assert not changed and again[0].position == 5 and again[0].start == 5


def test_max_splits_budget_advances_oldest_first():
    splits = [Split(f"f{i}") for i in range(5)]
    extents = {s.split_id: SplitExtent(1, 1) for s in splits}
    records, _ = plan_epoch((), splits, extents, Budget(max_splits=2), 0)
    assert [r.split_id for r in records if r.position > r.start] == ["f0", "f1"]
    assert [r.split_id for r in records if r.finished] == ["f0", "f1"]


def test_a_max_splits_budget_counts_each_splits_share():
    splits = [Split(f"f{i}") for i in range(8)]
    extents = {s.split_id: SplitExtent(1, 1, share=0.25) for s in splits}
    extents["f1"] = SplitExtent(1, 1)  # a whole one among small ones
    records, _ = plan_epoch((), splits, extents, Budget(max_splits=2), 0)
    # taken while the shares so far are under the budget: 0.25 + 1 + 0.25 + 0.25 = 1.75 < 2, then one more
    assert [r.split_id for r in records if r.finished] == ["f0", "f1", "f2", "f3", "f4"]


def test_units_budget_is_shared_evenly_and_exactly():
    splits = [Split(str(i)) for i in range(3)]
    extents = {s.split_id: SplitExtent(1000) for s in splits}
    records, _ = plan_epoch((), splits, extents, Budget(max_units=100), 0)
    grants = [r.position for r in records]
    assert sum(grants) == 100 and max(grants) - min(grants) <= 1


def test_read_ranges_include_split_that_finishes_in_this_epoch_with_payload():
    records, _ = plan_epoch((), [Split("x", "payload")], {"x": SplitExtent(3, 3)}, Budget(), 7)
    [rng] = read_ranges(_ckpt(records, 7))
    assert (rng.split_id, rng.payload, rng.start, rng.end) == ("x", "payload", 0, 3)


def test_split_records_are_frozen():
    rec = SplitRecord("a", 0, 1)
    try:
        rec.position = 5  # type: ignore[misc]
    except Exception as exc:  # dataclasses.FrozenInstanceError
        assert "cannot assign" in str(exc)
    else:
        raise AssertionError("SplitRecord must be immutable")
