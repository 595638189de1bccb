"""Two-phase-commit sinks: the protocol, the decision log, the commit algorithm, the adapters."""

from flinkish_spark.sink.committer import CommitResult, commit_epoch
from flinkish_spark.sink.foreach_batch import transactional
from flinkish_spark.sink.protocol import CommitOutcome, PrepareContext, TwoPhaseCommitSink

__all__ = ["CommitOutcome", "CommitResult", "PrepareContext", "TwoPhaseCommitSink", "commit_epoch", "transactional"]
