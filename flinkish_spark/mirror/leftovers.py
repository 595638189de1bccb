"""The replication slot and publication a failed run of ``flinkish mirror`` created: dropped, or how to drop them.

Guarantee: a run that created the source's slot and publication (its checkpoint folder claimed
none when it started) and failed before the source wrote its first checkpoint drops them again
-- nothing references them (a restart of the same command starts from scratch and creates them
anew), and nothing should hold WAL on the server while the cause is fixed. Once the source has a
checkpoint, Spark's offset log may reference the slot's position: they stay (the same command
continues from them) and the exact SQL that drops them is printed, for giving the mirror up.
"""

from __future__ import annotations

import time

from flinkish_spark.errors import FlinkishError
from flinkish_spark.mirror.config import MirrorConfig
from flinkish_spark.mirror.preflight import source_of

#: How long a drop waits for the failed run's replication connection to end (the slot is "active" until then).
DROP_PATIENCE_S = 10.0


def claimed(config: MirrorConfig) -> bool:
    """Whether the mirror's checkpoint folder already claims a slot or publication (an earlier run created them)."""
    from flinkish_spark.connectors.postgres.slot import Ownership

    if config.source_kind != "postgres":  # MySQL: no slot, no publication -- nothing on the server to claim
        return False
    source = source_of(config)
    return Ownership.read(source.io, source.checkpoint_store().directory) is not None


def release(config: MirrorConfig, claimed_before: bool) -> list[str]:
    """After a failed run: drop what it created if nothing references it yet, else say how to; the lines to print."""
    if claimed_before or config.source_kind != "postgres":
        return []
    from flinkish_spark.connectors.postgres import publication as publications
    from flinkish_spark.connectors.postgres import slot as slots
    from flinkish_spark.connectors.postgres.connection import connect

    source = source_of(config)
    store = source.checkpoint_store()
    owned = slots.Ownership.read(source.io, store.directory)
    if owned is None:
        return []
    with connect(source.conn_info, autocommit=True) as conn:
        slot = owned.slot_created and slots.slot_info(conn, owned.slot)[0] != "missing"
        pub = owned.publication_created and publications.exists(conn, owned.publication)
        if not slot and not pub:
            return []
        what = " and ".join([f"the replication slot {owned.slot!r}"] * slot + [f"the publication {owned.publication!r}"] * pub)
        if not store.ids():
            deadline = time.monotonic() + DROP_PATIENCE_S
            while True:
                try:
                    slots.drop(conn, owned)
                    return [f"dropped {what} this run created (its source had not read anything yet: a restart "
                            "creates them anew)"]
                except __import__("psycopg").errors.ObjectInUse:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)  # the failed run's replication connection is still ending
                except FlinkishError:
                    break
        sql = "; ".join([f"SELECT pg_drop_replication_slot('{owned.slot}')"] * slot
                        + [f"DROP PUBLICATION {owned.publication}"] * pub)
    return [f"{what} this run created stay on the server, so that the same command continues from its committed "
            f"epochs (the slot holds WAL until then). To give this mirror up instead: "
            f"psql '{source.conn_info.url}' -c \"{sql}\" and delete {config.checkpoint}"]
