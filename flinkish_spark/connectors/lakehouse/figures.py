"""What one table's rows of an epoch were, counted where the routing sinks split the stream: the figures a
mirror's status and metrics show per table (:mod:`flinkish_spark.mirror.counts`).

Each task counts its rows per source table while it splits them (:class:`Figures` in the table's part of the
committable); the commit sums the decided parts (:func:`epoch_figures`) and the framework records the sum with
the epoch's ``.done`` marker (:meth:`~flinkish_spark.sink.protocol.EpochCommitter.figures`). So the figures of an
epoch are those of the committables that were made visible -- the decision's, also when a restart commits it --
and are recorded once per epoch, however often the epoch is replayed. Rows are counted as the stream carries
them (a change before a truncate in the same epoch counts), as Spark's observed metrics of the batch count them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import pyarrow as pa

_WITH_COMMIT_TS = ("c", "u", "d", "t")  # the ops whose source commit time counts for a lag


@dataclass(frozen=True)
class Figures:
    snapshot_rows: int = 0  # _op r
    changes: int = 0  # _op c, u, d
    truncates: int = 0  # _op t
    commit_us: int = -1  # the newest source commit time of the changes and truncates (epoch µs; -1: none)

    def plus(self, other: "Figures") -> "Figures":
        return Figures(self.snapshot_rows + other.snapshot_rows, self.changes + other.changes,
                       self.truncates + other.truncates, max(self.commit_us, other.commit_us))

    def to_json(self) -> list[int]:
        """Compact, as committables and ``.done`` markers hold it: ``[r, c, t, commit_us]``."""
        return [self.snapshot_rows, self.changes, self.truncates, self.commit_us]

    @staticmethod
    def from_json(value: Any) -> "Figures":
        """From :meth:`to_json`; a committable written before figures existed has none: zeros."""
        if not value:
            return Figures()
        r, c, t, ts = (int(x) for x in value)
        return Figures(r, c, t, ts)


def figures_by_table(stream: pa.Table) -> dict[str, Figures]:
    """The figures of a task's stream rows (columns ``_table``, ``_op``, ``_commit_ts``) by source table: one
    hash aggregate over the rows (count and newest commit time per table and ``_op``)."""
    ts = stream.column("_commit_ts")
    if ts.type.unit != "us":
        ts = ts.cast(pa.timestamp("us", ts.type.tz))
    keyed = pa.table({"table": stream.column("_table"), "op": stream.column("_op"), "us": ts.cast(pa.int64())})
    out: dict[str, Figures] = {}
    for g in keyed.group_by(["table", "op"]).aggregate([("op", "count"), ("us", "max")]).to_pylist():
        op, n = g["op"], int(g["op_count"])
        newest = -1 if g["us_max"] is None or op not in _WITH_COMMIT_TS else int(g["us_max"])
        f = Figures(n if op == "r" else 0, n if op in ("c", "u", "d") else 0, n if op == "t" else 0, newest)
        out[g["table"]] = out.get(g["table"], Figures()).plus(f)
    return out


def epoch_figures(parts: Iterable[Any]) -> dict[str, Any]:
    """The figures of an epoch by source table, from its decided parts (each with ``table`` and ``figures``):
    ``{"tables": {name: [r, c, t, commit_us]}}``, what the ``.done`` marker records."""
    by_table: dict[str, Figures] = {}
    for p in parts:
        by_table[p.table] = by_table.get(p.table, Figures()).plus(p.figures)
    return {"tables": {name: f.to_json() for name, f in sorted(by_table.items())}}
