"""Where a planned binary log range is cut for several readers (no server): about equal shares of its changes,
only at the transaction boundaries the planning read, never a piece under the minimum, nothing after a truncate,
and a bounded memory for a range of millions of transactions."""

from __future__ import annotations

from flinkish_spark.connectors.mysql.position import FilePosition
from flinkish_spark.connectors.mysql.range_cuts import MAX_POINTS, CutPlanner

BASE = 7 << 32  # binlog.000007


def _at(offset: int) -> FilePosition:
    return FilePosition("binlog.000007", offset)


def _plan(sizes: list[int], truncate_at: int | None = None) -> tuple[CutPlanner, int, int]:
    """Transactions of ``sizes`` changes, each 100 bytes long from offset 4; (planner, end key, changes)."""
    planner, seen = CutPlanner(), 0
    for i, n in enumerate(sizes):
        seen += n
        if i == truncate_at:
            planner.truncate()
        planner.boundary(_at(104 + 100 * i), seen)
    return planner, BASE | (4 + 100 * len(sizes)), seen


def test_cuts_share_the_changes_evenly_at_transaction_boundaries() -> None:
    planner, end, total = _plan([10] * 100)
    assert planner.cuts(BASE | 4, end, total, readers=2, min_changes=100) == (BASE | 5004,)  # 500 changes each
    three = planner.cuts(BASE | 4, end, total, readers=3, min_changes=100)
    assert three == (BASE | 3304, BASE | 6704)  # the boundaries nearest 333 and 666 changes: 330 / 340 / 330
    assert planner.cuts(BASE | 4, end, total, readers=1, min_changes=1) == ()
    assert planner.cuts(BASE | 4, end, total, readers=4, min_changes=400) == (BASE | 5004,)  # 2 pieces of >= 400


def test_few_changes_stay_one_piece_and_a_big_transaction_is_never_cut() -> None:
    planner, end, total = _plan([10] * 10)
    assert planner.cuts(BASE | 4, end, total, readers=2, min_changes=100) == ()  # 100 changes: one piece
    # 1 + 10,000 + 1 changes: the middle falls inside the big transaction; the cut is one of its ends.
    planner, end, total = _plan([1, 10_000, 1])
    (cut,) = planner.cuts(BASE | 4, end, total, readers=2, min_changes=1)
    assert cut in (BASE | 104, BASE | 204)


def test_nothing_after_a_truncate_is_a_cut() -> None:
    planner, end, total = _plan([10] * 100, truncate_at=30)
    cuts = planner.cuts(BASE | 4, end, total, readers=4, min_changes=10)
    assert cuts and all(c <= BASE | (4 + 100 * 30) for c in cuts)  # at or before the truncate's transaction starts
    planner, end, total = _plan([10] * 100, truncate_at=0)
    assert planner.cuts(BASE | 4, end, total, readers=4, min_changes=10) == ()


def test_a_range_of_many_transactions_keeps_a_bounded_number_of_boundaries() -> None:
    planner, end, total = _plan([1] * 100_000)
    assert len(planner._keys) <= MAX_POINTS
    (cut,) = planner.cuts(BASE | 4, end, total, readers=2, min_changes=1)
    assert abs(((cut & 0xFFFFFFFF) - 4) // 100 - 50_000) <= 100_000 // (MAX_POINTS // 2)
