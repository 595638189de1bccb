"""The final checkpoint notification: "checkpoint complete" for the last epoch of a finished query.

Spark never passes the last batch's end offset to a source's ``commit``, so the finish
controller delivers it (FLIP-147's final checkpoint notification): for ``flinkish.files``
the cleanup of the files the last epoch read, for the PostgreSQL source the slot's advance.

It runs where the query's driver runs, because that is where the sources' systems are
reachable with the pipeline's credentials and extras: in the driver's Python process on a
Classic session; under Spark Connect, whose client may be a laptop without either, in a
one-task Spark job on the server. Idempotent (a restart delivers it again from Spark's own
``latestOffset``); a failure is logged, never raised: the notification is then deferred to
the query's next start.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.session import is_connect
from flinkish_spark.source.offset import SourceOffset

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


def metadata_io(off: SourceOffset) -> FileIO:
    assert off.root is not None
    return FileIO.for_url(off.root, storage_options_from(off.storage_options(), off.root), what="metadata root")


def notify_final_checkpoint(off: SourceOffset) -> bool:
    """Deliver "checkpoint complete" for ``off``'s checkpoint to a rebuilt copy of its source, here."""
    from flinkish_spark.source.datasource import SplitDataSource

    if off.ckpt < 0 or off.root is None:
        return True
    try:
        io = metadata_io(off)
        source = SplitDataSource.from_descriptor(io, off.root, off.uid, off.storage_options())
        store = source.checkpoint_store()
        ckpt = store.read(off.ckpt)
        enumerator = source.create_enumerator()
        enumerator.restore(ckpt.enumerator_state)
        enumerator.on_checkpoint_complete(ckpt)
        store.retain(source.retain, ckpt.ckpt_id)
        return True
    except Exception as exc:  # noqa: BLE001 - never fail a finished query over cleanup
        log.warning(
            "flinkish: final checkpoint notification for source uid %r (checkpoint %s) failed: %s; "
            "it is delivered again when the query next starts",
            off.uid,
            off.ckpt,
            exc,
        )
        return False


def _notify_batches(batches: Iterator["pa.RecordBatch"]) -> Iterator["pa.RecordBatch"]:
    """``mapInArrow`` body: the notification of every offset (JSON) in the batches, on the server."""
    import pyarrow as pa

    for batch in batches:
        delivered = []
        for raw in batch.column(0).to_pylist():
            off = SourceOffset.from_json(raw)
            delivered.append(off is not None and notify_final_checkpoint(off))
        yield pa.RecordBatch.from_pydict({"delivered": pa.array(delivered, pa.bool_())})


def notify_all(spark: Any, offsets: Sequence[SourceOffset]) -> None:
    """Deliver the notification to every source of ``offsets``: here, or on a Connect server."""
    if not is_connect(spark):
        for off in offsets:
            notify_final_checkpoint(off)
        return
    payload = [(json.dumps(off.to_json()),) for off in offsets if off.ckpt >= 0 and off.root is not None]
    if not payload:
        return
    try:
        rows = spark.createDataFrame(payload, "offset string").mapInArrow(_notify_batches, "delivered boolean").collect()
    except Exception as exc:  # noqa: BLE001 - never fail a finished query over cleanup
        log.warning("flinkish: the final checkpoint notification could not run on the Spark Connect server (%s); "
                    "it is delivered again when the query next starts", exc)
        return
    if not all(r.delivered for r in rows):
        log.warning("flinkish: a final checkpoint notification failed on the Spark Connect server (see its log); "
                    "it is delivered again when the query next starts")
