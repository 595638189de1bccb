"""A SparkSession helper that fails early and clearly on a bad setup: Classic or Spark Connect.

Spark's Python workers run under ``PYSPARK_PYTHON``; if that interpreter lacks
this package, every query dies with "Python worker failed to connect back" or
an import error deep in a task. :func:`session` checks Java and the worker
interpreter first (:mod:`flinkish_spark.environment`) and raises
:class:`~flinkish_spark.errors.EnvironmentSetupError` with the fix, then starts Spark with
workers that use the current interpreter.

``session(remote=...)`` gives a Spark Connect session instead: ``"sc://host:port"`` connects
to a running server (whose Python must have this package: it runs the sources, the sinks and
the ``foreachBatch`` functions); ``"local[N]"`` first starts a server for this process, in a
process of its own (:mod:`flinkish_spark.embedded.connect`). See docs/spark-connect.md.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Mapping

from flinkish_spark.connect_client import bound_retries, check_server_timeout, is_connect
from flinkish_spark.environment import (
    SESSION_DEFAULTS,
    check_java,
    check_worker_python,
    driver_conf,
    java_executable,
    local_driver_environment,
    with_class_archive,
)
from flinkish_spark.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["check_java", "check_session_workers", "is_connect", "java_executable", "session", "with_class_archive"]


def check_session_workers(spark: "SparkSession") -> None:
    """On a local master, fail unless the session's worker interpreter has this package.

    Workers of other masters run on other machines, and the Python of a Spark Connect server
    runs in the server's process: their interpreter cannot be probed here.
    """
    if is_connect(spark):
        return
    sc = spark.sparkContext
    if str(sc.master).startswith("local"):
        label = "PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON") else "the Spark workers' interpreter (PYSPARK_PYTHON unset)"
        check_worker_python(str(sc.pythonExec), label)


def session(
    master: str = "local[2]",
    app_name: str = "flinkish",
    conf: Mapping[str, str] | None = None,
    remote: str | None = None,
    server_timeout: float | None = None,
) -> "SparkSession":
    """Start (or get) a SparkSession whose workers can run flinkish_spark, with sources registered.

    ``master`` may be ``local[N]`` or ``local-cluster[N,cores,memoryMB]`` (separate
    executor JVMs). When ``SPARK_HOME`` is unset, it is set to a folder linking to the
    installed pyspark, without its ``pyspark.zip``, so that Python workers start from compiled
    code (see :mod:`flinkish_spark.worker_home`; set ``SPARK_HOME`` yourself to opt out).
    A local driver JVM maps Spark's classes from the archive that
    ``flinkish jvm-archive`` built, when there is one for this Java and
    Spark (see :mod:`flinkish_spark.jvm_archive`; ``FLINKISH_JVM_ARCHIVE=0`` to opt out).

    ``remote``: a Spark Connect session instead (``master`` is then ignored).
    ``"sc://host:port"`` connects to that server; ``conf`` entries are set on the session.
    ``"local"`` or ``"local[N]"`` starts a Connect server with master ``local[N]`` in a child
    process of this one (a free loopback port; ``conf`` goes to the server; the server stops
    when this process exits) and connects to it. Its streaming queries share the server's
    Python workers (``spark.sql.artifact.isolation.enabled`` is "false" on the session, see
    :data:`flinkish_spark.embedded.connect.ARTIFACT_ISOLATION`; ``conf`` may set it "true").
    ``server_timeout``: how long a call of the Connect session retries a server that does not
    answer before it fails (seconds, default 60, see :mod:`flinkish_spark.connect_client`; pyspark
    alone retries for about ten minutes); ``await_finished`` then raises
    :class:`~flinkish_spark.errors.ConnectServerUnavailableError`.
    """
    if remote is not None:
        return _connect_session(remote, app_name, conf, server_timeout)
    check_java()
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    check_worker_python(python)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.update(local_driver_environment(master, python))

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in driver_conf(master, python, conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from flinkish_spark import register

    register(spark, check_workers=False)  # checked above, before Spark started
    return spark


def _connect_session(remote: str, app_name: str, conf: Mapping[str, str] | None,
                     server_timeout: float | None) -> "SparkSession":
    server_timeout = check_server_timeout(server_timeout)  # before a server is started for nothing
    session_conf = dict(conf or {})
    if remote == "local" or remote.startswith("local["):
        from flinkish_spark.embedded.connect import ARTIFACT_ISOLATION, start_connect_server

        master = "local[*]" if remote == "local" else remote
        # A server of this process alone: its streaming queries share its Python daemons instead
        # of starting four per query (see ARTIFACT_ISOLATION). A session conf, set on the session
        # (the server would override it); conf={ARTIFACT_ISOLATION: "true"} keeps Spark's default.
        isolation = session_conf.pop(ARTIFACT_ISOLATION, "false")
        server = start_connect_server(master, conf=session_conf, tie_to_this_process=True)
        url, session_conf = server.url, {ARTIFACT_ISOLATION: isolation}
    elif remote.startswith("sc://"):
        url = remote
        session_conf = {**SESSION_DEFAULTS, **session_conf}  # session confs: a server of others keeps its own
    else:
        raise ConfigError(
            f"session(remote={remote!r}): expected a Spark Connect URL 'sc://host:port' or 'local[N]' "
            "(a Connect server started for this process)"
        )
    from pyspark.sql import SparkSession

    # Without the client libraries, pyspark itself names what to install (pip install
    # 'flinkish_spark[connect]' brings them).
    builder = SparkSession.builder.remote(url).appName(app_name)
    for key, value in session_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from flinkish_spark import register

    bound_retries(spark, server_timeout)  # before any further call: each may meet a dead server
    register(spark)
    return spark
