"""One exception hierarchy for flinkish_spark.

Every error the package raises is a :class:`FlinkishError`. Each one is either

* :class:`TerminalError` -- retrying the same call cannot help: the input, the
  configuration or the stored metadata is wrong and a person must change
  something (the message says what and how), or
* :class:`RetryableError` -- a transient condition (a storage endpoint that did
  not answer, a throttled request); the same call may succeed later.

Messages name the thing that is wrong (option, path, file, uid) and the fix.
Spark wraps exceptions raised in Python workers in its own exception types; the
class name and message of these errors stay visible in Spark's message text.
"""

from __future__ import annotations


class FlinkishError(Exception):
    """Base class of every error raised by flinkish_spark."""

    retryable: bool = False


class TerminalError(FlinkishError):
    """An error that the same call will hit again: fix the input first."""

    retryable = False


class RetryableError(FlinkishError):
    """A transient error: the same call may succeed later."""

    retryable = True


# -- configuration and environment ------------------------------------------------


class ConfigError(TerminalError, ValueError):
    """A bad option, option value or combination of options."""


class EnvironmentSetupError(TerminalError):
    """The machine is not set up to run Spark with this package (Java, PYSPARK_PYTHON)."""


class ConnectServerUnavailableError(RetryableError):
    """The Spark Connect server stopped answering (or restarted) while a client waited on it: its query is gone
    with it; run the same script again once the server is back (it continues from its checkpoints)."""


# -- storage --------------------------------------------------------------------------


class StorageError(FlinkishError):
    """Base class of object-store and file-system errors."""


class StorageUnavailableError(StorageError, RetryableError):
    """The storage endpoint did not answer or answered with a transient failure."""


class StorageAccessError(StorageError, TerminalError):
    """The storage refused the request (missing bucket, permission, unwritable path)."""


class AlreadyExistsError(StorageError, TerminalError):
    """An exclusive (put-if-absent) create found the object already there."""


# -- checkpoint metadata ----------------------------------------------------------------


class MetadataError(TerminalError):
    """Base class of problems with stored checkpoint metadata."""


class CorruptMetadataError(MetadataError):
    """A metadata file is truncated, not Parquet, or internally inconsistent."""


class ForeignMetadataError(MetadataError):
    """A file in the metadata store was not written by flinkish_spark, or by another source."""


class UnsupportedFormatVersionError(MetadataError):
    """A metadata file was written by a newer flinkish_spark than the one reading it."""


class CheckpointMismatchError(MetadataError):
    """A restarted query does not match what its checkpoint recorded."""


# -- sinks and fencing ------------------------------------------------------------------


class FencedError(TerminalError):
    """Another live run of the same query holds the lease for this source or sink uid."""


class CommitFailedError(TerminalError):
    """A sink refused to commit an epoch whose decision is recorded; a restart retries it."""


class CommitRetryExhaustedError(RetryableError):
    """A sink kept answering 'retry later' for an epoch; a restart retries the commit."""


# -- databases (flinkish.postgres) ------------------------------------------------------


class DatabaseUnavailableError(RetryableError):
    """The database server did not answer (down, restarting, unreachable)."""


class DatabaseAccessError(TerminalError):
    """The database refused the connection (authentication, unknown role or database) or a permission."""


class TargetSchemaError(TerminalError):
    """The target does not fit the query: a table is missing, lacks a column, has an incompatible type or no
    unique key, or (:class:`TableMismatchError`) a Delta/Iceberg table has another schema or partitioning."""


class PostgresSourceError(TerminalError):
    """The server, the table or the replication slot does not allow the flinkish.postgres source to run as asked."""


class TargetWriteError(TerminalError):
    """The database rejected an epoch's rows (a constraint violation, a bad value); nothing of the epoch is visible."""


# -- tables (lakehouse sinks) --------------------------------------------------------------


class TableMismatchError(TargetSchemaError):
    """A Delta or Iceberg table does not fit the query (another schema or partitioning), or the path is no table."""


class ChangeDataError(TerminalError):
    """A row of a change stream cannot be applied by key (a null key column, an ``_op`` other than r/c/u/d);
    nothing of the epoch is visible."""


class SchemaChangeError(TargetSchemaError):
    """A source table's schema changed in a way its routed target cannot follow (a narrowed type, a type of
    another kind, a changed primary key); raised before anything of the epoch is written, naming the table,
    the column and what to do."""
