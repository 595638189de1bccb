"""``flinkish demo`` (``./dev demo``): a real pipeline on this machine, killed with SIGKILL mid-commit, restarted,
and checked.

* ``--pipeline mirror`` (the default, :mod:`.mirror`): the project's main job -- ``flinkish mirror`` of an
  embedded PostgreSQL shop database (:mod:`.shop`) that a writer keeps changing, into local Delta tables;
  its driver killed once between two tables' commits and the same command started again; a column
  added and a table created while it runs; a drain at the end; every table compared with its source.
* ``--pipeline files`` (:mod:`.files`): ``flinkish.files`` -> the two-phase-commit ``flinkish.parquet``
  sink on a local S3 server; with ``--remote`` through a Spark Connect server.
"""

from __future__ import annotations

PIPELINES = ("mirror", "files")


def run_demo(workdir: str, remote: bool = False, pipeline: str | None = None) -> int:
    """Run the demo ``pipeline`` (default: ``mirror``; ``files`` with ``remote``) in ``workdir``; its exit code."""
    if pipeline == "mirror" and remote:
        from flinkish_spark.errors import ConfigError

        raise ConfigError("flinkish demo: --remote runs the files demo through Spark Connect; the mirror demo "
                          "runs `flinkish mirror` on local Spark (the command itself takes --remote sc://host:port: "
                          "docs/mirror.md, 'On a cluster'). Drop --remote, or use --pipeline files --remote")
    if (pipeline or ("files" if remote else "mirror")) == "files":
        from flinkish_spark.demo import files

        return files.run(workdir, remote=remote)
    from flinkish_spark.demo import mirror

    return mirror.run(workdir)
