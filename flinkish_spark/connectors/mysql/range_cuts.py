"""Where a planned binary log range may be cut so that several tasks read it at once (``changeReaders``).

:meth:`.dialect.MysqlDialect.change_target` walks the whole range when it plans it; :class:`CutPlanner` notes, as it
goes, the transaction boundaries and how much of the followed tables' work comes before each -- the bytes of their
row events (:mod:`.range_scan`, a range planned without a limit), or their changes (a range planned with
``maxRowsPerTrigger``, whose rows are counted) -- and then picks the boundaries that split the range's work into
about equal pieces. What it guarantees:

* **A cut is a transaction boundary** (a :attr:`.changes.Transaction.end` the planning read): a reader started there
  reads whole transactions, each with the table maps its row events need (a binary log repeats them in every
  transaction), so a piece's rows are decoded as in one read of the whole range; a transaction is never cut, how
  big soever (the one that crosses a share's middle goes whole to one piece).
* **Few changes stay one piece**: every piece gets at least ``min_changes`` (a reader costs a connection, the log
  dump's start and a Spark task, ~tens of ms); by bytes, ``min_changes`` times :data:`CHANGE_BYTES`.
* **No cut after a ``TRUNCATE``** of a followed table (from the first one in the range on, everything is the last
  piece): a routing sink takes a task whose rows hold a truncate as the last word on that table in the epoch (it
  drops the rows of the table's other tasks: snapshot rows, which come before every change --
  ``lakehouse.routing.TableEpoch.counted``), which holds only if no later piece holds rows of it.

Memory is bounded: at most :data:`MAX_POINTS` boundaries are kept (every other one is dropped and the spacing
doubled when full), so a range of millions of transactions costs a few kB; a cut then lands within
``1 / MAX_POINTS`` of the range's changes of its ideal place.
"""

from __future__ import annotations

import bisect

from flinkish_spark.connectors.mysql.changes import position_key
from flinkish_spark.connectors.mysql.position import FilePosition

#: boundaries kept per planned range (see the module docstring)
MAX_POINTS = 4096
#: the least changes a piece gets (option ``changeReaderMinChanges``): at ~10-25 us a change, a few hundred ms of
#: decoding, against a reader's fixed cost of tens of ms
DEFAULT_MIN_CHANGES = 10_000
#: a change's bytes in a row event, about (a one-row event of a six-column table is ~90 bytes; a row of a bulk
#: statement's event fewer): the least bytes of a piece cut by bytes is ``changeReaderMinChanges`` times this
CHANGE_BYTES = 100
#: the most readers a range is cut for (option ``changeReaders``)
MAX_READERS = 64


class CutPlanner:
    """The boundaries of one range as its planning reads it (see the module docstring)."""

    def __init__(self) -> None:
        self._keys: list[int] = []  # position keys of transaction ends, ascending
        self._counts: list[int] = []  # changes before each of them (from the planning's scan start)
        self._step = 1  # the least number of changes between two boundaries kept
        self._fenced = False  # a truncate was seen: no boundary after it is a cut

    def boundary(self, end: FilePosition, changes: int) -> None:
        """A transaction ends at ``end`` with ``changes`` changes of followed tables read before it."""
        if self._fenced or (self._counts and changes - self._counts[-1] < self._step):
            return
        self._keys.append(position_key(end))
        self._counts.append(changes)
        if len(self._keys) > MAX_POINTS:
            self._keys, self._counts = self._keys[1::2], self._counts[1::2]
            self._step *= 2

    def truncate(self) -> None:
        """The transaction being read truncates a followed table: the boundaries noted so far (all at or before
        its start) are the last that may be cuts."""
        self._fenced = True

    def cuts(self, start: int, end: int, total: int, readers: int, min_changes: int) -> tuple[int, ...]:
        """Up to ``readers - 1`` cuts strictly inside ``(start, end)`` that share ``total`` changes evenly, each
        piece at least ``min_changes`` (a boundary after ``end`` is not one: a range cut short by a limit)."""
        pieces = min(readers, total // max(1, min_changes))
        if pieces < 2:
            return ()
        out: list[int] = []
        last = 0  # changes before the previous cut
        for k in range(1, pieces):
            want = total * k // pieces
            i = bisect.bisect_left(self._counts, want)
            near = [j for j in (i - 1, i) if 0 <= j < len(self._counts)]
            if not near:
                continue
            j = min(near, key=lambda j: abs(self._counts[j] - want))
            key, before = self._keys[j], self._counts[j]
            if start < key < end and before - last >= min_changes and total - before >= min_changes and (
                    not out or key > out[-1]):
                out.append(key)
                last = before
        return tuple(out)
