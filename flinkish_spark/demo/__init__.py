"""``flinkish demo`` (``./dev demo``): a real pipeline on this machine, killed with SIGKILL mid-commit, restarted,
and checked. :mod:`.files`: ``flinkish.files`` -> the two-phase-commit ``flinkish.parquet`` sink on a local S3
server; with ``--remote`` through a Spark Connect server."""

from __future__ import annotations


def run_demo(workdir: str, remote: bool = False) -> int:
    from flinkish_spark.demo import files

    return files.run(workdir, remote=remote)
