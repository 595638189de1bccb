"""trackHistoryColumns' planning (lakehouse.tracked), in memory: which versions absorb their predecessor, which
rows are dropped and which _valid_from each kept version takes -- no table files (reads are stubs)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa

from flinkish_spark.connectors.lakehouse.resolve import Matches, resolve_epoch
from flinkish_spark.connectors.lakehouse.resolve_task import resolve_task
from flinkish_spark.connectors.lakehouse.routing import table_plan
from flinkish_spark.connectors.lakehouse.table_modes import TableMode
from flinkish_spark.connectors.lakehouse.tracked import absorb_untracked

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
DATA = pa.schema([("id", pa.int64()), ("n", pa.int64()), ("v", pa.string())])


def at(s: int) -> dt.datetime:
    return T0 + dt.timedelta(seconds=s)


def epoch(rows: list[tuple], table_row: tuple | None = None):
    """One task's changes (id, op, n, v, lsn) of tracked column 'n'; ``table_row`` (n, v, valid_from): the key's
    current version in the table. Returns the changes after absorbing and the Apply."""
    plan = table_plan(DATA, ("id",), "mergeOnRead", TableMode("history", "true", ("n",)), "public.t")
    changes = pa.table({"id": [r[0] for r in rows], "n": [r[2] for r in rows], "v": [r[3] for r in rows],
                        "_op": [r[1] for r in rows], "_lsn": [r[4] for r in rows],
                        "_commit_ts": pa.array([at(r[4]) for r in rows], pa.timestamp("us", tz="UTC")),
                        "_unchanged": pa.nulls(len(rows), pa.list_(pa.string()))}, schema=plan.input_schema)
    task = resolve_task(plan, changes)
    ep = resolve_epoch(plan, [(0, task.entries)])
    matches = Matches({})
    table = None
    if table_row is not None:
        matches = Matches({"f": (np.array([0]), np.array([0]))})
        table = pa.table({"id": [1], "n": [table_row[0]], "v": [table_row[1]],
                          "_valid_from": pa.array([table_row[2]], pa.timestamp("us", tz="UTC"))})

    def read(file, t, positions):
        return table.take(pa.array(positions)) if file is not None else task.rows.take(pa.array(positions))

    absorb_untracked(ep, matches, read)
    return ep, ep.apply(matches)


def test_an_untracked_change_after_a_tracked_one_updates_the_new_version_and_a_delete_ends_the_run():
    ep, out = epoch([(1, "u", 1, "a", 10), (1, "u", 1, "b", 11), (1, "u", 2, "c", 12), (1, "u", 2, "d", 13),
                     (1, "d", None, None, 14), (1, "c", 2, "e", 15)])
    # kept: the version of n=1 (values of 'b', from 10), of n=2 (values of 'd', from 12), the delete, the insert
    assert ep.entries.column("_e_ts").to_pylist() == [at(10), at(12), at(14), at(15)]
    assert sorted(out.new_deletes[0].tolist()) == [0, 1, 2, 3]  # 'a' and 'c' absorbed; 'b' and 'd' copied with times
    copied = {int(p): {k: v.to_pylist()[i] for k, v in c.overrides.items()}
              for c in out.copies for i, p in enumerate(c.positions)}
    assert copied[1]["_valid_from"] == at(10) and copied[1]["_valid_to"] == at(12)
    assert copied[3]["_valid_from"] == at(12) and copied[3]["_valid_to"] == at(14) and not copied[3]["_current"]


def test_the_tables_current_version_is_replaced_not_closed_when_only_untracked_columns_change():
    ep, out = epoch([(1, "u", 7, "new", 20)], table_row=(7, "old", at(3)))
    assert out.table_deletes["f"].tolist() == [0]
    assert [c.file for c in out.copies] == [None]  # no closed copy of the table's row
    assert out.copies[0].overrides["_valid_from"].to_pylist() == [at(3)]
    ep, out = epoch([(1, "u", 8, "new", 20)], table_row=(7, "old", at(3)))  # a tracked change: closed as today
    assert [c.file for c in out.copies] == ["f"]
    assert out.copies[0].overrides["_valid_to"].to_pylist() == [at(20)]
