"""``flinkish.postgres`` source: a table's snapshot in parallel chunks that finish, then its changes.

Flink CDC's PostgreSQL source and Flink's HybridSource in the flinkish split model:

* **Snapshot** splits ``snapshot-<g>-<n>``: ranges of the split column (the first primary
  key column, or ``splitColumn``) of about ``splitSize`` rows, whose boundaries the
  enumerator computes once. A chunk is read whole, in Arrow through ADBC, in one epoch and
  is FINISHED from then on: it is never read again, also after a restart.
* **Changes** split ``changes-<g>``: its position is a WAL position (LSN). Each epoch's
  range ``[start, end)`` is fixed by the enumerator in ``latestOffset`` (end = the server's
  WAL flush position, or earlier under ``maxRowsPerTrigger``) and holds every transaction
  whose commit record starts in it. The reader peeks it from the slot
  (``pg_logical_slot_peek_binary_changes`` up to ``end``) without consuming, so a replay reads
  the same rows. The slot is advanced only in the "checkpoint complete" notification of an
  epoch (and the final notification), to that epoch's end -- never before.

Consistency between snapshot and changes (the reasoning the guarantee rests on): the slot is
created before the snapshot starts, at consistent point S. Chunks are read later, each at
its own moment T >= S, without an exported snapshot (a snapshot exported by a replication
connection dies with that connection; a chunked snapshot that survives restarts cannot keep
it). The change split starts only in the epoch after every chunk's epoch is committed, and
reads every change committed after S, in commit order. Each change is a full row image
(insert, update) or a key (delete); a key change is a delete of the old key then the new row.
For a sink that applies rows keyed by the primary key (upsert + deletes), the last change of
a key determines its final value whatever the snapshot held, and a key without a change after
S was the same at S and at T. So after the change stream has passed the time the last chunk
was read, the target equals the table; in between it may briefly show older values of keys
that changed during the snapshot (re-applied changes). Not covered: a ``TRUNCATE`` (the source
stops with an error), an update that leaves a TOASTed value (> ~2 kB) unchanged (the source
stops with an error naming the column, unless the table has ``REPLICA IDENTITY FULL``: then the
value comes from the old row), changes of the table's
columns while running, and an append-only sink (it would see the overlap as duplicates).

Output: the table's columns, plus ``_op`` (``r`` snapshot read, ``c`` insert, ``u`` update,
``d`` delete), ``_lsn`` (the commit LSN of the change's transaction, null for snapshot rows)
and ``_commit_ts``. An epoch's changes are one Spark partition in WAL order (commit order,
then order within the transaction): a keyed sink that keeps the last row per key in the
order Spark produced them (as the ``flinkish.postgres`` sink does) applies them right.

With the option ``tables`` (names and patterns) one source follows many tables through one
slot and one publication: the CDC core shared with MySQL (:mod:`flinkish_spark.connectors.cdc`:
patterns, registry, catalog poll, the generic enumerator and reader, the stream schema) with
PostgreSQL as its dialect (:mod:`.dialect`; :mod:`.tables_enumerator`: the start with the
publication and the slot; :mod:`.tables_reader`: chunks and WAL ranges as rows of the one
stream schema of :mod:`flinkish_spark.connectors.postgres.rows`, schema rows included).
docs/cdc-core.md. The single-table modules above are unchanged by it.
"""

from flinkish_spark.connectors.postgres.source.datasource import PostgresSourceDataSource
from flinkish_spark.connectors.postgres.source.enumerator import PostgresEnumerator
from flinkish_spark.connectors.postgres.source.reader import PostgresReader
from flinkish_spark.connectors.postgres.source.snapshot import Chunk, chunk_boundaries
from flinkish_spark.connectors.postgres.source.tables import ColumnInfo, TableInfo, load_table_info

__all__ = [
    "Chunk", "ColumnInfo", "PostgresEnumerator", "PostgresReader", "PostgresSourceDataSource", "TableInfo",
    "chunk_boundaries", "load_table_info",
]
