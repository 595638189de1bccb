"""Two-phase-commit sinks: the protocol, the decision log, the commit algorithm, the adapters.

The names below are imported on first access (:mod:`flinkish_spark.lazy_exports`): a worker
that needs one module of this package (e.g. a source's lease) does not import the others.
"""

from typing import TYPE_CHECKING

from flinkish_spark.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from flinkish_spark.sink.committer import CommitResult, commit_epoch
    from flinkish_spark.sink.foreach_batch import transactional, transactional_with
    from flinkish_spark.sink.protocol import CommitOutcome, EpochCommitter, PrepareContext, TwoPhaseCommitSink
else:
    __getattr__, __dir__ = lazy_exports(__name__, {
        "CommitResult": "flinkish_spark.sink.committer",
        "commit_epoch": "flinkish_spark.sink.committer",
        "transactional": "flinkish_spark.sink.foreach_batch",
        "transactional_with": "flinkish_spark.sink.foreach_batch",
        "CommitOutcome": "flinkish_spark.sink.protocol",
        "EpochCommitter": "flinkish_spark.sink.protocol",
        "PrepareContext": "flinkish_spark.sink.protocol",
        "TwoPhaseCommitSink": "flinkish_spark.sink.protocol",
    })

__all__ = ["CommitOutcome", "CommitResult", "EpochCommitter", "PrepareContext", "TwoPhaseCommitSink", "commit_epoch",
           "transactional", "transactional_with"]
