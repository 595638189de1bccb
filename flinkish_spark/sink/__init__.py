"""Two-phase-commit sinks: the protocol, the decision log, the commit algorithm, the adapters."""

from flinkish_spark.sink.committer import CommitResult, commit_epoch
from flinkish_spark.sink.foreach_batch import transactional, transactional_with
from flinkish_spark.sink.protocol import CommitOutcome, EpochCommitter, PrepareContext, TwoPhaseCommitSink

__all__ = ["CommitOutcome", "CommitResult", "EpochCommitter", "PrepareContext", "TwoPhaseCommitSink", "commit_epoch",
           "transactional", "transactional_with"]
