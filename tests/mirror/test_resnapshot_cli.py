"""``flinkish mirror resnapshot`` as a user runs it (a subprocess; no Spark, no server): the request
it records, the line it prints, and its errors -- each before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from flinkish_spark.checkpoint.layout import source_dir
from flinkish_spark.connectors.cdc import resnapshot_request as rr
from flinkish_spark.io.fileio import FileIO
from flinkish_spark.testing.checkpoints import postgres_source


def flinkish(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flinkish_spark.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_a_request_is_recorded_and_the_command_says_what_happens(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    io = FileIO.for_url(root)
    postgres_source(io, root, "mirror", ["public.orders", "public.customers", "sales.items"])

    stopped = flinkish("mirror", "resnapshot", "--checkpoint", root, "public.orders")
    assert stopped.returncode == 0, stopped.stderr
    [req] = rr.pending(io, source_dir(root, "mirror"), ())
    assert req.tables == ("public.orders",) and req.reason == "flinkish mirror resnapshot"
    assert stopped.stdout == (f"resnapshot request {req.id} for source uid mirror: the mirror is not running: when "
                              "it runs again, its first epoch starts re-reading public.orders; the target keeps its "
                              "rows until the epoch that ends the re-snapshot\n")

    # A live lease (as the running source's heartbeat keeps it): the next epoch takes it.
    lease = {"run_id": "r", "renewed_ms": int(time.time() * 1000), "host": "h", "pid": 1}
    (tmp_path / "meta" / "sources" / "mirror" / "_lease.json").write_text(json.dumps(lease))
    running = flinkish("mirror", "resnapshot", "--checkpoint", root, "--uid", "mirror", "sales.*", "public.Orders")
    assert running.returncode == 0, running.stderr
    assert "for source uid mirror: the next epoch starts re-reading public.orders, sales.items; " in running.stdout
    assert len(rr.pending(io, source_dir(root, "mirror"), ())) == 2


def test_errors_name_the_problem_and_write_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "meta")
    out = flinkish("mirror", "resnapshot", "--checkpoint", root, "public.orders")
    assert out.returncode == 2 and f"ConfigError: resnapshot: no flinkish checkpoint at {root}" in out.stderr

    io = FileIO.for_url(root)
    postgres_source(io, root, "mirror", ["public.orders", "public.customers"])
    postgres_source(io, root, "single", None)
    out = flinkish("mirror", "resnapshot", "--checkpoint", root, "--uid", "mirror", "public.ordres")
    assert out.returncode == 2, out.stderr
    assert ("resnapshot: source uid 'mirror' follows no table 'public.ordres'. Did you mean 'public.orders'? "
            "It follows: public.customers, public.orders") in out.stderr
    out = flinkish("mirror", "resnapshot", "--checkpoint", root, "--uid", "single", "public.orders")
    assert out.returncode == 2 and "source uid 'single' under" in out.stderr and "follows one table" in out.stderr
    out = flinkish("mirror", "resnapshot", "public.orders")
    assert out.returncode == 2 and "the following arguments are required: --checkpoint" in out.stderr
    assert list(tmp_path.rglob(f"{rr.FOLDER}/*")) == []

    # `flinkish mirror` keeps its positional pipeline file, and names the new word in its usage.
    out = flinkish("mirror", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "nope.yaml" in out.stderr, out.stderr
    assert "flinkish mirror resnapshot --checkpoint URL" in flinkish("mirror", "--help").stdout
