"""An epoch's per-table work in ``parallelism`` tasks: the multi-table stream spread by table before the routing sink.

The ``flinkish.postgres`` source reads an epoch's changes in one task (one replication slot, read
in WAL order: that stays serial). Without a spread, the routing sink's work for every changed
table -- decoding its rows, the keyed prepare, its files -- runs in that same task.
:func:`spread_tables` adds one shuffle: the change rows go to ``hash(_table) mod parallelism``,
so the sink's prepare runs in ``parallelism`` tasks, each with whole tables.

Why the result stays exact (the guarantee of :mod:`flinkish_spark.connectors.postgres.rows`):

* **One task per table's changes.** Every change row of a table -- data, ``t`` (truncate) and the
  ``s`` rows announcing its schemas (they carry the table's ``_table``) -- goes to the same task, so
  a table's keys are prepared by one task only (the keyed prepare's lookup never sees a key of the
  epoch from two tasks) and every task holds the schema rows its rows name.
* **Stream order.** The change rows come from one input partition: a shuffle keeps the order of
  one map output within a reducer, and :func:`~flinkish_spark.connectors.postgres.rows.split_tables`
  sorts a table's rows by ``(_lsn, _seq)`` anyway (snapshot rows first).
* **Snapshot chunks stay as they were.** Snapshot rows (``_lsn`` null: ``r``, their ``s`` rows
  and the re-snapshot markers ``B``/``E``) keep their chunk's partition together -- spread by the
  input partition, not by table -- so a big table's chunks still run in several tasks, each with its
  own ``s`` row; the routing sinks already take a table's snapshot parts from several tasks besides
  its change part (guarantee 4: snapshot rows in any interleaving with the changes).
* **Exactly once** is the sink's as before: every task's part goes into the one decision record
  of the epoch, committed on the driver.

``parallelism = 1`` leaves the stream as it is (no shuffle): the per-table work runs in the read task.

A ``flinkish.postgres`` source with ``spreadChanges`` hands its change rows to the tasks by table itself (the driver
reads the range it bounded: :mod:`flinkish_spark.source.spread_read`), with the same two properties; the mirror
then adds no shuffle (:meth:`flinkish_spark.mirror.config.MirrorConfig.spread_in_source`).
"""

from __future__ import annotations

from typing import Any

#: The shuffle key column, dropped again before the sink (which refuses any column the stream does not have).
_KEY = "__flinkish_spread"


def spread_tables(df: Any, parallelism: int) -> Any:
    """``df`` (the multi-table stream) repartitioned into ``parallelism`` partitions by table (see the module)."""
    if parallelism <= 1:
        return df
    from pyspark.sql import functions as F

    key = F.when(F.col("_lsn").isNull(), F.concat(F.lit("\u0000chunk"), F.spark_partition_id().cast("string"))) \
        .otherwise(F.col("_table"))
    return df.withColumn(_KEY, key).repartition(parallelism, _KEY).drop(_KEY)
