"""A SparkSession helper for local use that fails early and clearly on a bad setup.

Spark's Python workers run under ``PYSPARK_PYTHON``; if that interpreter lacks
this package, every query dies with "Python worker failed to connect back" or
an import error deep in a task. :func:`session` checks Java and the worker
interpreter first and raises :class:`~flinkish_spark.errors.EnvironmentSetupError`
with the fix, then starts Spark with workers that use the current interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import TYPE_CHECKING, Mapping

from flinkish_spark.errors import EnvironmentSetupError
from flinkish_spark.jvm_archive import driver_java_options
from flinkish_spark.worker_home import fast_worker_spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise EnvironmentSetupError(
            f"JAVA_HOME is {java_home!r}, but {candidate} is not an executable. Point JAVA_HOME at a "
            f"Java {MIN_JAVA}+ installation, or unset it to use the java on PATH."
        )
    found = shutil.which("java")
    if not found:
        raise EnvironmentSetupError(
            f"Java was not found: Spark needs Java {MIN_JAVA} or newer. Install it (e.g. "
            "'apt-get install openjdk-17-jre-headless') or set JAVA_HOME."
        )
    return found


def check_java() -> int:
    java = java_executable()
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvironmentSetupError(f"{java} -version failed ({exc}); install Java {MIN_JAVA}+") from None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        raise EnvironmentSetupError(f"could not read the Java version from '{java} -version': {out.stderr.strip()!r}")
    major = int(m.group(1))
    if major == 1 and m.group(2):
        major = int(m.group(2))
    if major < MIN_JAVA:
        raise EnvironmentSetupError(
            f"{java} is Java {major}; Spark 4 needs Java {MIN_JAVA} or newer. Install a newer Java "
            "and put it first on PATH or set JAVA_HOME."
        )
    return major


def check_worker_python(python: str, what: str = "PYSPARK_PYTHON") -> None:
    """Fail unless ``python`` can import pyspark and flinkish_spark (what workers need)."""
    resolved = python if os.sep in python else (shutil.which(python) or python)
    if os.path.realpath(resolved) == os.path.realpath(sys.executable):
        return
    try:
        probe = subprocess.run(
            [python, "-c", "import flinkish_spark, pyspark"], capture_output=True, text=True, timeout=120
        )
    except OSError as exc:
        raise EnvironmentSetupError(
            f"{what} is {python!r}, which cannot be run ({exc}). Unset PYSPARK_PYTHON or set "
            f"it to {sys.executable}."
        ) from None
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        raise EnvironmentSetupError(
            f"{what} is {python!r}, but that interpreter cannot import flinkish_spark ({last}). "
            f"Spark workers would fail with 'Python worker failed to connect back'. Unset PYSPARK_PYTHON "
            f"or set it to {sys.executable}, the interpreter that has the package."
        )


def check_session_workers(spark: "SparkSession") -> None:
    """On a local master, fail unless the session's worker interpreter has this package.

    Workers of other masters run on other machines: their interpreter cannot be probed here.
    """
    sc = spark.sparkContext
    if str(sc.master).startswith("local"):
        label = "PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON") else "the Spark workers' interpreter (PYSPARK_PYTHON unset)"
        check_worker_python(str(sc.pythonExec), label)


def with_class_archive(master: str, conf: Mapping[str, str] | None) -> dict[str, str]:
    """``conf`` with the driver JVM option that maps the class archive, for local masters that have one.

    The user's own ``spark.driver.extraJavaOptions`` come after ours, so that theirs win.
    """
    out = dict(conf or {})
    if master.startswith("local") and not master.startswith("local-cluster"):
        archive = driver_java_options(java_executable(), os.environ.get("SPARK_HOME"))
        if archive:
            out["spark.driver.extraJavaOptions"] = f"{archive} {out.get('spark.driver.extraJavaOptions', '')}".strip()
    return out


def session(
    master: str = "local[2]",
    app_name: str = "flinkish",
    conf: Mapping[str, str] | None = None,
) -> "SparkSession":
    """Start (or get) a SparkSession whose workers can run flinkish_spark, with sources registered.

    ``master`` may be ``local[N]`` or ``local-cluster[N,cores,memoryMB]`` (separate
    executor JVMs). When ``SPARK_HOME`` is unset, it is set to a folder linking to the
    installed pyspark, without its ``pyspark.zip``, so that Python workers start from compiled
    code (see :mod:`flinkish_spark.worker_home`; set ``SPARK_HOME`` yourself to opt out).
    A local driver JVM maps Spark's classes from the archive that
    ``flinkish jvm-archive`` built, when there is one for this Java and
    Spark (see :mod:`flinkish_spark.jvm_archive`; ``FLINKISH_JVM_ARCHIVE=0`` to opt out).
    """
    check_java()
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    check_worker_python(python)
    os.environ["PYSPARK_PYTHON"] = python
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local runs stay on loopback
    # Workers that import the installed (compiled) pyspark instead of the zip start 1.5 s faster
    # each; only for local masters, whose workers run this very interpreter.
    home = fast_worker_spark_home(python) if master.startswith("local") else None
    if home is not None:
        os.environ["SPARK_HOME"] = home
    elif master.startswith("local-cluster"):
        import pyspark

        os.environ.setdefault("SPARK_HOME", os.path.dirname(pyspark.__file__))

    from pyspark.sql import SparkSession

    conf = with_class_archive(master, conf)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.executorEnv.PYSPARK_PYTHON", python)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from flinkish_spark import register

    register(spark, check_workers=False)  # checked above, before Spark started
    return spark
