"""A range's rows cut into partitions by a key (:mod:`flinkish_spark.source.spread_read`): every row once, each key's
rows in one partition in read order, rows without a key in partition 0, and no partitions past the budget."""

from __future__ import annotations

import pickle

import pyarrow as pa

from flinkish_spark.source.spread_read import RowsPartition, partition_rows, spread_rows

SCHEMA = pa.schema([("_table", pa.string()), ("n", pa.int64())])


def batches(keys: list[str | None], per_batch: int) -> list[pa.RecordBatch]:
    out = []
    for i in range(0, len(keys), per_batch):
        part = keys[i:i + per_batch]
        out.append(pa.RecordBatch.from_arrays([pa.array(part, pa.string()), pa.array(range(i, i + len(part)))],
                                              schema=SCHEMA))
    return out


def rows_of(parts: list[RowsPartition]) -> list[list[tuple[str | None, int]]]:
    # through pickle, as Spark ships a partition to its task
    return [[(r["_table"], r["n"]) for b in partition_rows(pickle.loads(pickle.dumps(p))) for r in b.to_pylist()]
            for p in parts]


def test_each_key_goes_to_one_partition_in_read_order_and_every_row_once() -> None:
    keys = [f"public.t{i % 37}" for i in range(1000)] + [None, None]
    parts = spread_rows(batches(keys, 64), "_table", 4, ckpt_id=7)
    assert parts is not None and len(parts) == 4
    assert {p.ckpt_id for p in parts} == {7}
    got = rows_of(parts)
    assert sorted(n for part in got for _, n in part) == list(range(len(keys)))  # every row, once
    for part in got:
        assert [n for _, n in part] == sorted(n for _, n in part)  # read order kept
    owner: dict[str | None, int] = {}
    for i, part in enumerate(got):
        for key, _ in part:
            assert owner.setdefault(key, i) == i  # a key's rows in one partition
    assert owner[None] == 0


def test_partitions_no_key_went_to_are_left_out_and_an_empty_range_has_none() -> None:
    parts = spread_rows(batches(["public.only"] * 10, 4), "_table", 8, ckpt_id=1)
    assert parts is not None and len(parts) == 1 and len(rows_of(parts)[0]) == 10
    assert spread_rows([], "_table", 8, ckpt_id=1) == []


def test_past_the_budget_nothing_is_spread() -> None:
    data = batches([f"public.t{i % 5}" for i in range(5000)], 500)
    assert spread_rows(data, "_table", 2, ckpt_id=1, budget=10_000) is None
    assert spread_rows(data, "_table", 2, ckpt_id=1, budget=10_000_000) is not None
