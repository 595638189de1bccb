"""What a Spark driver on this machine needs: Java 17+, a worker interpreter that has this
package, and the environment that makes its Python workers start fast.

Used by :func:`flinkish_spark.session` (a driver in this process) and by
:mod:`flinkish_spark.embedded.connect` (a Spark Connect server in a process of its own): both
check the same things and give the driver the same environment, so a pipeline behaves alike
on either. Every failed check raises :class:`~flinkish_spark.errors.EnvironmentSetupError`
naming the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Mapping

from flinkish_spark.errors import EnvironmentSetupError
from flinkish_spark.jvm_archive import driver_java_options
from flinkish_spark.worker_home import fast_worker_spark_home

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


def with_class_archive(master: str, conf: Mapping[str, str] | None, spark_home: str | None = None) -> dict[str, str]:
    """``conf`` with the driver JVM option that maps the class archive, for local masters that have one.

    ``spark_home``: the driver's (default: ``$SPARK_HOME``). The user's own
    ``spark.driver.extraJavaOptions`` come after ours, so that theirs win.
    """
    out = dict(conf or {})
    if master.startswith("local") and not master.startswith("local-cluster"):
        archive = driver_java_options(java_executable(), spark_home or os.environ.get("SPARK_HOME"))
        if archive:
            out["spark.driver.extraJavaOptions"] = f"{archive} {out.get('spark.driver.extraJavaOptions', '')}".strip()
    return out


def local_driver_environment(master: str, python: str) -> dict[str, str]:
    """The environment variables a driver of ``master`` whose workers run ``python`` needs.

    ``PYSPARK_PYTHON``; ``SPARK_LOCAL_IP`` on loopback for local masters; ``SPARK_HOME``: for
    local masters whose workers run this interpreter a folder linking to the installed pyspark
    without its ``pyspark.zip`` (workers start from compiled code, see
    :mod:`flinkish_spark.worker_home`), the installed pyspark for ``local-cluster`` (its executor
    JVMs need one). A ``SPARK_HOME`` the user set is kept.
    """
    env = {"PYSPARK_PYTHON": python}
    if master.startswith("local"):
        env["SPARK_LOCAL_IP"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")  # local runs stay on loopback
    # Workers that import the installed (compiled) pyspark instead of the zip start 1.5 s faster
    # each; only for local masters, whose workers run this very interpreter.
    home = fast_worker_spark_home(python) if master.startswith("local") else None
    if home is not None:
        env["SPARK_HOME"] = home
    elif master.startswith("local-cluster") and not os.environ.get("SPARK_HOME"):
        import pyspark

        env["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    return env


#: Session settings flinkish's sessions start with (local drivers, the Connect servers it starts, and
#: ``sc://`` sessions it opens); the caller's ``conf`` wins.
#:
#: ``spark.sql.execution.arrow.maxBytesPerBatch``: Spark hands rows to a Python sink task in Arrow batches of
#: ``maxRecordsPerBatch`` (10,000) rows, its byte cap unset. A packed CDC stream (``rowFormat=arrow``) is a few
#: rows of megabytes each, so without a byte cap an epoch's packs cross in one batch, after the source task has
#: read the whole range: the sink waits idle for the read, then holds every pack at once. At 4 MiB a pack goes
#: on as soon as the source yields it (measured on one table, 300,000 changes: the sink's first batch 1.5 s ->
#: 0.75 s after the task's start; docs/benchmarks.md). Rows of a few hundred bytes (the JSON shape, most
#: tables) still fill 10,000-row batches under the cap.
SESSION_DEFAULTS: Mapping[str, str] = {"spark.sql.execution.arrow.maxBytesPerBatch": str(4 << 20)}


def driver_conf(master: str, python: str, conf: Mapping[str, str] | None = None,
                spark_home: str | None = None) -> dict[str, str]:
    """The Spark settings flinkish starts a local driver with; ``conf`` entries win."""
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.executorEnv.PYSPARK_PYTHON": python,
        **SESSION_DEFAULTS,
    }
    return with_class_archive(master, {**defaults, **(conf or {})}, spark_home)
