"""The ``flinkish.postgres`` sinks' bookkeeping tables: ``flinkish_commits`` and the staging tables.

* ``flinkish_commits`` (in the target's schema): one row per committed (sink uid, epoch, part),
  written in the transaction that makes the epoch's rows visible -- what makes a commit
  idempotent (checked first, in the same transaction) and what a reset checkpointLocation is
  checked against.
* A staging table per sink uid and target: tasks bulk-load an epoch's rows there (*prepare*),
  tagged with the epoch, the task attempt, the partition and the row's position; the driver's
  commit moves the decided attempts' rows. Unique names per uid keep two sinks apart.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterator

import pyarrow as pa

from flinkish_spark.connectors.postgres.connection import qualified
from flinkish_spark.errors import CommitFailedError

COMMITS_TABLE = "flinkish_commits"
# Staging-table bookkeeping columns: which attempt wrote a row, and its order in the epoch.
S_EPOCH, S_ATTEMPT, S_PART, S_ROW = "_flinkish_epoch", "_flinkish_attempt", "_flinkish_part", "_flinkish_row"


class Bookkeeping:
    """Where a plan's bookkeeping tables are, from its ``schema`` and ``staging_table``."""

    schema: str
    staging_table: str

    @property
    def staging(self) -> str:
        return qualified(self.schema, self.staging_table)

    @property
    def commits(self) -> str:
        return qualified(self.schema, COMMITS_TABLE)


def staging_table_name(uid: str, table: str) -> str:
    digest = hashlib.sha1(f"{uid}\0{table}".encode()).hexdigest()[:10]
    return f"flinkish_staging_{''.join(c if c.isalnum() else '_' for c in uid)[:30]}_{digest}".lower()


def create_commits_table(c: Any, schema: str) -> None:
    c.execute(
        f"CREATE TABLE IF NOT EXISTS {qualified(schema, COMMITS_TABLE)} (sink_uid text NOT NULL, epoch bigint NOT NULL, "
        "part text NOT NULL, target text NOT NULL, commit_mode text NOT NULL, rows bigint NOT NULL, "
        "written_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink_uid, epoch, part))"
    )


def check_staged(c: Any, plan: Bookkeeping, uid: str, epoch: int, attempt_ids: list[str], want: int) -> None:
    """Raise CommitFailedError unless the staging table holds the ``want`` rows the decision names
    (in the commit's transaction, after ``flinkish_commits`` showed the epoch is not committed)."""
    have = c.execute(f"SELECT count(*) FROM {plan.staging} WHERE {S_EPOCH} = %s AND {S_ATTEMPT} = ANY(%s)",
                     (epoch, attempt_ids)).fetchone()[0]
    if have != want:
        raise CommitFailedError(
            f"epoch {epoch} of sink uid {uid!r}: the staging table {plan.schema}.{plan.staging_table} holds "
            f"{have} of the epoch's {want} decided rows and {plan.commits} has no record of the epoch: staged "
            "rows were deleted by hand. The epoch's data is lost from the sink and must be rewritten"
        )


def clear_staged(c: Any, staging: str, epoch: int) -> None:
    """Delete the epoch's staged rows, in the commit's transaction.

    TRUNCATE (no dead tuples, no VACUUM debt) when the table holds nothing else, which is
    the normal case: Spark runs the next epoch's tasks only after this commit, and
    leftovers of other epochs are removed by their own cleanup.
    """
    other = c.execute(f"SELECT 1 FROM {staging} WHERE {S_EPOCH} <> %s LIMIT 1", (epoch,)).fetchone()
    if other is None:
        c.execute(f"TRUNCATE {staging}")
    else:
        c.execute(f"DELETE FROM {staging} WHERE {S_EPOCH} = %s", (epoch,))


def chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Spark's small Arrow batches gathered into tables of about ``rows`` rows (one COPY each)."""
    pending: list[pa.RecordBatch] = []
    count = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        pending.append(b)
        count += b.num_rows
        if count >= rows:
            yield pa.Table.from_batches(pending)
            pending, count = [], 0
    if pending:
        yield pa.Table.from_batches(pending)
