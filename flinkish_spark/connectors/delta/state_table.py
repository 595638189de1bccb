"""A keyed target's table read at a process's start without delta-rs: validated from the sink's own state.

Why: delta-rs's ``DeltaTable(...)`` lists the whole ``_delta_log`` folder (on local disk and
Azure every name with its metadata) -- O(every version the table ever had) -- and a mirror's
driver loads one per target at each start: 3 ms per table at 10 versions, 84 ms at 30,000
(docs/benchmarks.md), for every one of ~1,000 tables after a restart. The sink's own
:func:`~flinkish_spark.connectors.delta.state.load_state` reads ``_last_checkpoint``, the
checkpoint and the commits after it (one GET each): O(live files + versions since the
checkpoint), whatever the table's age.

:class:`StateTable` answers, from that state, what validation and the log head ask of a
delta-rs table (version, txn, protocol, metadata, schema), so the same checks run on it
(:meth:`~flinkish_spark.connectors.delta.table.DeltaTarget.check_table`). :func:`load_validated`
answers None where it cannot (no table there, no commit yet, a checkpoint it does not read): the
caller takes delta-rs's way then, with its errors.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flinkish_spark.connectors.delta.state import DeltaState, configuration, load_state
from flinkish_spark.errors import TableMismatchError

if TYPE_CHECKING:
    from flinkish_spark.connectors.delta.table import DeltaTarget


@dataclass(frozen=True)
class Protocol:
    """As delta-rs's ``ProtocolVersions``."""

    min_reader_version: int
    min_writer_version: int
    reader_features: list[str] | None
    writer_features: list[str] | None


@dataclass(frozen=True)
class Metadata:
    """As much of delta-rs's ``Metadata`` as validation reads."""

    configuration: dict[str, str]
    partition_columns: list[str]


class StateTable:
    """A table at the state's version, with the parts of delta-rs's ``DeltaTable`` that validation uses."""

    def __init__(self, state: DeltaState) -> None:
        assert state.protocol is not None and state.metadata is not None
        self.state = state

    def version(self) -> int:
        return self.state.version

    def transaction_version(self, uid: str) -> int | None:
        return self.state.txns.get(uid)

    def protocol(self) -> Protocol:
        p = self.state.protocol or {}
        features = (lambda v: None if v is None else list(v))  # noqa: E731
        return Protocol(int(p["minReaderVersion"]), int(p["minWriterVersion"]), features(p.get("readerFeatures")),
                        features(p.get("writerFeatures")))

    def metadata(self) -> Metadata:
        m = self.state.metadata or {}
        return Metadata(configuration(m), list(m.get("partitionColumns") or ()))

    def schema(self) -> Any:
        from flinkish_spark.connectors.delta.table import deltalake

        return deltalake().Schema.from_json((self.state.metadata or {})["schemaString"])


def load_validated(target: DeltaTarget, component: str) -> DeltaState | None:
    """The target's newest state, its table validated and the log head set -- None when the log does not
    give one (no table or no commit at the path, or a checkpoint not readable here): use delta-rs then.

    Raises what validation raises (TableMismatchError: a table the sink may not write)."""
    try:
        state = load_state(target.log(), validated=sys.maxsize)  # validated below, at the version loaded
    except (FileNotFoundError, TableMismatchError):
        return None
    if state.protocol is None or state.metadata is None:
        return None
    table = StateTable(state)
    target.check_table(table, component)
    target.set_head(table)
    return state
