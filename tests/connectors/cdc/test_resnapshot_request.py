"""Re-snapshot requests (no Spark, no server): stored write-once, taken exactly once across crashes.

The enumerator's side is modelled by :class:`Planner`: what the multi-table enumerator does with the
module when it plans an epoch (``take``, its state entry) and when an epoch is committed
(``delete_handled``). A "crash" is a new Planner restored from the state of the checkpoint Spark
resumes from -- the only thing a restarted source has.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import flinkish_spark
from flinkish_spark.checkpoint.layout import source_dir
from flinkish_spark.checkpoint.model import SourceCheckpoint
from flinkish_spark.connectors.cdc import resnapshot_request as rr
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.errors import AlreadyExistsError, ConfigError
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.checkpoints import postgres_source


class Planner:
    """The enumerator's hook, alone: its handled set, restored from a checkpoint's state."""

    def __init__(self, io: FileIO, directory: str, state: bytes = b"") -> None:
        self.io, self.directory = io, directory
        self.handled = rr.handled_of_state(state)

    def plan(self, ckpt_id: int) -> tuple[SourceCheckpoint, list[str]]:
        """Plan epoch ``ckpt_id``: the ids of the requests it carries out, and its checkpoint."""
        taken = rr.take(self.io, self.directory, self.handled)
        self.handled = taken.handled
        state = json.dumps({"registry": "v1.json", **rr.state_entry(self.handled)}).encode()
        ckpt = SourceCheckpoint("m", "flinkish.postgres", ckpt_id, None, 0, "{}", state, False)
        return ckpt, [r.id for r in taken.requests]

    def complete(self, ckpt: SourceCheckpoint) -> None:
        rr.delete_handled(self.io, self.directory, ckpt)


@pytest.fixture
def where(tmp_path: Path) -> tuple[FileIO, str]:
    root = str(tmp_path / "meta")
    return FileIO.for_url(root), source_dir(root, "m")


def files(directory: str) -> list[str]:
    folder = Path(rr.folder(directory))
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_request_is_write_once_and_pending_lists_the_unhandled_oldest_first(where: tuple[FileIO, str]) -> None:
    io, d = where
    late = rr.write_request(io, d, ["public.b"], "test", "bbbbbbbbbbbb", now_ms=2000)
    early = rr.write_request(io, d, ["public.a", "public.a"], "test", "aaaaaaaaaaaa", now_ms=1000)
    assert early.tables == ("public.a",)
    with pytest.raises(AlreadyExistsError):
        rr.write_request(io, d, ["public.c"], "test", "aaaaaaaaaaaa", now_ms=1000)
    Path(rr.folder(d), "0000000000500-cccccccccccc.json").write_text("{not json")  # damaged: no request
    Path(rr.folder(d), "notes.txt").write_text("a user's note")
    assert rr.pending(io, d, ()) == [early, late]
    assert rr.pending(io, d, {"aaaaaaaaaaaa"}) == [late]


def test_taken_once_when_spark_logged_the_offset_and_again_when_it_did_not(where: tuple[FileIO, str]) -> None:
    io, d = where
    x = rr.write_request(io, d, ["public.orders"], "test").id
    first = Planner(io, d)
    carried, taken = first.plan(3)
    assert taken == [x] and rr.handled_of_state(carried.enumerator_state) == {x}
    assert first.plan(4)[1] == [], "a request is taken in one epoch only"

    # Crash before Spark logged the offset of the epoch that took it: the restart plans again from
    # the checkpoint before it, whose state knows nothing of it -- and the file is still there.
    before = Planner(io, d, b"")
    assert before.plan(carried.ckpt_id)[1] == [x]

    # Crash after: the restart continues from that checkpoint (or a later one): never again.
    after = Planner(io, d, carried.enumerator_state)
    assert after.plan(carried.ckpt_id + 1)[1] == []
    assert files(d) != [], "kept until the epoch that took it is committed"

    # The epoch is committed: the file goes, and the id leaves the state in the next planning.
    after.complete(carried)
    assert files(d) == []
    ckpt, taken = after.plan(carried.ckpt_id + 2)
    assert taken == [] and rr.handled_of_state(ckpt.enumerator_state) == frozenset()
    assert rr.STATE_KEY not in json.loads(ckpt.enumerator_state), "no requests: the state is as before"


def test_a_commit_deletes_only_what_its_own_checkpoint_took(where: tuple[FileIO, str]) -> None:
    """A request taken after checkpoint N was planned is not deleted when N completes, even though the
    planner's handled set in memory has it: a crash then restores from N, and it must be taken again."""
    io, d = where
    x = rr.write_request(io, d, ["public.a"], "test", now_ms=1000).id
    planner = Planner(io, d)
    n, taken = planner.plan(5)
    assert taken == [x]
    y = rr.write_request(io, d, ["public.b"], "test", now_ms=2000).id
    n_plus_1, taken = planner.plan(6)  # not logged by Spark yet
    assert taken == [y]
    planner.complete(n)
    assert [n.split("-")[1] for n in files(d)] == [f"{y}.json"]
    assert Planner(io, d, n.enumerator_state).plan(6)[1] == [y], "a crash now: y is taken again"
    planner.complete(n_plus_1)
    assert files(d) == []
    planner.complete(n_plus_1)  # again (notifications repeat): nothing to do, no error


def test_a_crash_between_the_deletion_and_the_next_checkpoint_takes_nothing(where: tuple[FileIO, str]) -> None:
    io, d = where
    x = rr.write_request(io, d, ["public.a"], "test").id
    planner = Planner(io, d)
    n, _ = planner.plan(1)
    planner.complete(n)
    restarted = Planner(io, d, n.enumerator_state)
    assert restarted.handled == {x}
    assert restarted.plan(2)[1] == [] and restarted.handled == frozenset()


def test_a_request_withdrawn_by_hand_before_it_is_taken_is_never_taken(where: tuple[FileIO, str]) -> None:
    io, d = where
    req = rr.write_request(io, d, ["public.a"], "test")
    Path(rr.folder(d), req.file_name).unlink()
    assert Planner(io, d).plan(1)[1] == []


def test_the_requests_name_the_followed_tables_by_their_oids() -> None:
    reg = Registry().with_entries([TableEntry(0, 100, "public", "a", "streaming"),
                                   TableEntry(1, 101, "public", "b", "snapshot")], 2)
    reqs = [rr.Request("r1", ("public.a", "public.gone"), 1, "x"), rr.Request("r2", ("public.b", "public.a"), 2, "y")]
    assert rr.oids(reqs, reg) == [100, 101]
    assert rr.reason(reqs) == "request r1 (x); request r2 (y)"


# ------------------------------------------------------------------------- flinkish_spark.resnapshot


def test_resnapshot_records_the_followed_tables_its_names_and_patterns_match(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    io = FileIO.for_url(root)
    postgres_source(io, root, "mirror", ["public.orders", "public.customers", "sales.items"])
    rid = flinkish_spark.resnapshot(root, ["public.Orders", "sales.*"])
    [req] = rr.pending(io, source_dir(root, "mirror"), ())
    assert req.id == rid and req.tables == ("public.orders", "sales.items")
    assert flinkish_spark.resnapshot(root, "public.customers, public.orders", uid="mirror") != rid


@pytest.mark.parametrize("setup, tables, uid, message", [
    ("none", ["public.orders"], None, "no flinkish checkpoint at"),
    ("multi", ["public.ordrs"], None, "follows no table 'public.ordrs'. Did you mean 'public.orders'?"),
    ("multi", ["nope.*"], None, "follows no table 'nope.*'. It follows: public.customers, public.orders"),
    ("multi", ["public.orders"], "mirorr", "no source uid 'mirorr' under"),
    ("multi", ["!public.orders"], None, "exclusions are not taken here"),
    ("multi", ["orders"], None, "is not 'schema.table'"),
    ("single", ["public.orders"], None, "follows one table (option 'table')"),
    ("finished", ["public.orders"], None, "is FINISHED"),
    ("snapshot", ["public.orders"], None, "copies a snapshot only"),
    ("two", ["public.orders"], None, "2 flinkish.postgres sources under"),
])
def test_resnapshot_refuses_with_one_clear_error_and_writes_nothing(tmp_path: Path, setup: str, tables: list[str],
                                                                     uid: str | None, message: str) -> None:
    root = str(tmp_path / "meta")
    io = FileIO.for_url(root)
    names = ["public.orders", "public.customers"]
    if setup in ("multi", "two"):
        postgres_source(io, root, "mirror", names)
    if setup == "two":
        postgres_source(io, root, "other", names)
    if setup == "single":
        postgres_source(io, root, "mirror", None)
    if setup in ("finished", "snapshot"):
        postgres_source(io, root, "mirror", names, startup=setup if setup == "snapshot" else "initial",
                        finished=setup == "finished")
    with pytest.raises(ConfigError, match="resnapshot: .*" + re.escape(message)):
        flinkish_spark.resnapshot(root, tables, uid=uid)
    assert list(tmp_path.rglob(f"{rr.FOLDER}/*")) == []
