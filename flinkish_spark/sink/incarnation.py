"""Which run of a streaming query a sink uid's epochs belong to, and where they land in the target.

Spark numbers epochs (batch ids) from 0 again when a query's ``checkpointLocation`` is
deleted or replaced -- and deleting it also deletes the sink's default metadata
(``<checkpointLocation>/flinkish``). Taken for the sink's own, those epochs would be skipped
as committed (Delta ``txn``, Iceberg snapshot property, PostgreSQL ``flinkish_commits``:
silently lost rows), overwrite committed files (``flinkish.parquet``'s deterministic names)
or let a cleanup delete files a committed table version names. This module stops that at
start, on the driver, before any task writes:

* The *incarnation record* ``<checkpoint>/sinks/<uid>/_query.json`` names the Spark query
  whose epochs the sink writes (its id, from ``<checkpointLocation>/metadata``, or the
  ``sql.streaming.queryId`` Spark sets for ``foreachBatch``) and the *epoch offset*: the
  target epoch of Spark batch ``b`` is ``b + offset`` (0 unless a reset was continued).
  Decision log, data folders, file names and the target's idempotence record all use the
  target epoch; only the adapters (``sink/datasource.py``, ``sink/foreach_batch.py``) see
  Spark's batch ids.
* When the record is missing, or names another Spark query, the metadata cannot be trusted
  and the *target* is asked (:meth:`~flinkish_spark.sink.protocol.EpochCommitter.last_committed_epoch`),
  together with the decision log. If either holds an epoch of the uid, the query is refused
  with one :class:`~flinkish_spark.errors.CheckpointMismatchError` naming the uid, that epoch
  and the choices. With ``continueAfterEpoch = N`` (N at least that epoch) a new record with
  offset ``N + 1`` is written: every epoch of the new run lands after every committed one, so
  no txn version, data folder or file name can collide.
* A record written by an older flinkish (``foreachBatch`` wrote none) is recognised by the
  batch id: Spark continues at or after the last decided epoch, a reset starts below it.

Costs: one GET of the record per call; the target is asked only when the record is missing
or names another query (a new query, or a reset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.errors import AlreadyExistsError, CheckpointMismatchError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.sink.decisions import DecisionLog

QUERY_FILE = "_query.json"


@dataclass(frozen=True)
class Incarnation:
    """The Spark query whose batches a sink uid writes, and the offset of its epochs in the target."""

    query_id: str | None
    checkpoint_location: str | None
    epoch_offset: int = 0

    def epoch(self, batch_id: int) -> int:
        """The target epoch of Spark's batch ``batch_id``."""
        return batch_id + self.epoch_offset

    def encode(self) -> bytes:
        return json.dumps({"checkpointLocation": self.checkpoint_location, "queryId": self.query_id,
                           "epochOffset": self.epoch_offset}).encode()


def record_path(log: DecisionLog) -> str:
    return join(log.directory, QUERY_FILE)


def read_record(io: FileIO, log: DecisionLog) -> Incarnation | None:
    """The record, None when there is none (or it is damaged: then the target decides)."""
    try:
        raw = json.loads(io.read_bytes(record_path(log)))
        offset = int(raw.get("epochOffset") or 0)
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError, TypeError):
        return None
    location, query = raw.get("checkpointLocation"), raw.get("queryId")
    return Incarnation(str(query) if query else None, str(location) if location else None, offset)


def _same_query(record: Incarnation, query_id: str | None) -> bool:
    return record.query_id is None or query_id is None or record.query_id == query_id


def resolve(
    io: FileIO,
    log: DecisionLog,
    last_committed_epoch: Callable[[], int | None],
    query_id: str | None,
    checkpoint_location: str | None,
    continue_after: int | None,
    option: str,
    first_batch: int | None = None,
) -> Incarnation:
    """The incarnation this run writes as; written before any task of it runs.

    ``last_committed_epoch`` asks the target (None: it cannot tell); ``option`` is how the
    user spells "continue after epoch N" here (``continueAfterEpoch`` or
    ``continue_after_epoch=``); ``first_batch`` is Spark's batch id when known (foreachBatch).
    Raises CheckpointMismatchError, having written nothing, when the target or the decision
    log already holds epochs of the uid that this query did not write.
    """
    for _ in range(3):
        record = read_record(io, log)
        same = record is not None and _same_query(record, query_id)
        if record is not None and same and first_batch is None:
            return record  # the steady state: one GET
        decided, _done = log.epochs()
        behind = first_batch is not None and record is not None and _behind(decided, record.epoch(first_batch))
        if record is not None and same and not behind:
            return record
        decided_last = decided[-1] if decided else -1
        target = last_committed_epoch()
        last = max(-1 if target is None else target, decided_last)
        if last < 0:
            chosen = Incarnation(query_id, checkpoint_location, 0)  # nothing anywhere: a fresh start
        elif record is None and decided and first_batch is not None and first_batch >= last:
            # A decision log from before incarnation records, and Spark goes on where it is.
            chosen = Incarnation(query_id, checkpoint_location, 0)
        elif continue_after is None or continue_after < last:
            if record is None:
                why = ("its metadata (the decision log's _query.json) is gone: the query's checkpointLocation, "
                       "or the sink's 'checkpoint', was deleted or replaced")
            elif behind:
                why = (f"Spark now runs batch {first_batch}, below the epochs its decision log decided: the query's "
                       "checkpointLocation was deleted or replaced")
            else:
                where = f"the checkpointLocation {checkpoint_location}" if checkpoint_location else "the checkpointLocation"
                why = (f"its epochs were written by the streaming query {record.query_id}, but {where} now belongs "
                       f"to the query {query_id}: it was deleted or replaced")
            raise _mismatch(log.uid, why, target, decided_last, continue_after, option)
        else:
            chosen = Incarnation(query_id, checkpoint_location, continue_after + 1)
        try:
            if record is None:
                io.write_exclusive(record_path(log), chosen.encode())
            else:
                io.write_bytes(record_path(log), chosen.encode())
        except AlreadyExistsError:
            continue  # another run of this query wrote it first: judge by its record
        return chosen
    raise CheckpointMismatchError(f"sink uid {log.uid!r}: {record_path(log)} keeps changing; is another query "
                                  "writing with this uid and metadata?")


def _behind(decided: list[int], epoch: int) -> bool:
    """Whether a run's first epoch is below the last decided one: Spark replays only its last
    batch, so a run starts at or after the last decided epoch -- unless Spark started over."""
    return bool(decided) and epoch < decided[-1]


def check_not_behind(log: DecisionLog, epoch: int, decided: list[int]) -> None:
    """Refuse to decide ``epoch`` below an epoch already decided (Spark replays only its last batch).

    The last line of defence where no query id tells a reset (e.g. an HDFS checkpointLocation):
    the epoch would otherwise be decided and committed under a number the log already used.
    """
    later = [e for e in decided if e > epoch]
    if later:
        raise CheckpointMismatchError(
            f"sink uid {log.uid!r} is asked to commit epoch {epoch}, but its decision log in {log.decisions} "
            f"already decided epoch {later[-1]}: Spark only ever replays its last batch, so this query's "
            "checkpointLocation was deleted or replaced. Restore it, give the sink a new 'uid', or continue "
            "after the target's last epoch (option 'continueAfterEpoch', transactional(continue_after_epoch=...))."
        )


def _mismatch(uid: str, why: str, target: int | None, decided: int, continue_after: int | None,
              option: str) -> CheckpointMismatchError:
    last = max(-1 if target is None else target, decided)
    where = (f"last committed epoch {target} in its target" if target is not None and target >= 0
             else "no committed epoch its target could name")
    if decided >= 0:
        where += f", decisions up to epoch {decided} in its decision log"
    head = (f"sink uid {uid!r} has {where}; {why}, so Spark starts again at epoch 0 and the sink would take "
            "those epochs for committed ones (new rows dropped, committed files replaced).")
    if continue_after is not None:
        head += f" The option {option}={continue_after} is below that epoch ({last}): the epochs would still collide."
    return CheckpointMismatchError(
        f"{head} Choose one: restore the old checkpointLocation; give the sink a new 'uid' (a new table or "
        f"path keeps the two apart); or continue after the target's last epoch with {option}={last} (this "
        f"query's epochs are then numbered from {last + 1})."
    )
