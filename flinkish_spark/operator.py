"""What every flinkish operator (source or sink) is configured with: a uid and a metadata root.

Flink identifies operator state by ``uid``; here the uid also names the operator's
folder below the metadata root. Both are validated, and the root's storage reached,
before anything is written.
"""

from __future__ import annotations

from dataclasses import dataclass

from flinkish_spark.checkpoint.layout import UID_PATTERN
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import FileIO, storage_options_from
from flinkish_spark.options import Options
from flinkish_spark.sink.lease import DEFAULT_TIMEOUT_S


def parse_uid(opts: Options) -> str:
    uid = opts.required("uid", "a stable name for this operator, e.g. .option('uid', 'orders')")
    if not UID_PATTERN.match(uid):
        raise ConfigError(
            f"{opts.component}: option 'uid' must be 1-128 letters, digits, '_', '-' or '.', "
            f"starting with a letter or digit; got {uid!r}"
        )
    return uid


@dataclass(frozen=True)
class OperatorSettings:
    uid: str
    checkpoint_root: str
    lease_timeout: float
    raw_options: dict[str, str]
    io: FileIO


def operator_settings(opts: Options, uid: str, checkpoint_root: str) -> OperatorSettings:
    """Settings of an operator whose ``uid`` was parsed first (its error comes first)."""
    root = checkpoint_root.rstrip("/")
    raw = opts.raw()
    return OperatorSettings(
        uid=uid,
        checkpoint_root=root,
        lease_timeout=opts.number("leaseTimeout", DEFAULT_TIMEOUT_S) or DEFAULT_TIMEOUT_S,
        raw_options=raw,
        io=FileIO.for_url(root, storage_options_from(raw, root), what="option 'checkpoint'"),
    )
