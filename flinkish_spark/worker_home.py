"""A SPARK_HOME for pip-installed PySpark whose Python workers import compiled pyspark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` first on every Python worker's path.
Python never caches bytecode for modules imported from a zip, so every worker process
Spark starts -- the data source lookup and planner, the streaming source runner, the
foreachBatch worker, the daemon that forks task workers -- first compiles pyspark from
source: 1.4-1.6 s of CPU each on the project's 2-vCPU machine (``import pyspark.worker``
from the zip 1.9-2.1 s, from the installed package 0.5 s), five or more times per query
start, on the query's critical path. See docs/benchmarks.md ("Python workers").

For a pip-installed PySpark that zip holds the same code as the installed package. When
the workers run the driver's own interpreter, :func:`fast_worker_spark_home` returns a
SPARK_HOME that links to everything of the installed pyspark except ``python/`` (where
the zip is), so workers import the installed package and its cached bytecode instead.

Guarantee: workers run exactly the pyspark the driver runs (the same interpreter, hence
the same installation). In every other case -- ``SPARK_HOME`` set by the user, another
worker interpreter, a PySpark that is not pip-installed, a cache folder that cannot be
written -- the function returns ``None`` and Spark's default stands. Setting
``SPARK_HOME`` yourself is the way to opt out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile

log = logging.getLogger(__name__)


def cache_root() -> str:
    """The folder flinkish keeps its per-machine caches in (``$XDG_CACHE_HOME/flinkish_spark``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flinkish_spark")


def fast_worker_spark_home(worker_python: str) -> str | None:
    """A SPARK_HOME without ``python/lib/pyspark.zip``, or ``None`` when it cannot be used safely."""
    if os.environ.get("SPARK_HOME"):
        return None  # the user's own Spark installation: never second-guess it
    if os.path.abspath(worker_python) != os.path.abspath(sys.executable):
        return None  # another interpreter may hold another pyspark: only the zip is sure to match the JVM
    import pyspark

    pyspark_dir = os.path.dirname(os.path.abspath(pyspark.__file__))
    if not (os.path.isdir(os.path.join(pyspark_dir, "jars")) and os.path.isfile(os.path.join(pyspark_dir, "bin", "spark-submit"))):
        return None  # not the pip layout (a source checkout, a distribution's python/ folder)
    tag = hashlib.sha256(pyspark_dir.encode()).hexdigest()[:12]
    home = os.path.join(cache_root(), f"spark-home-{pyspark.__version__}-{tag}")
    try:
        if not os.path.isfile(os.path.join(home, "bin", "spark-submit")):
            _build(home, pyspark_dir)
    except OSError as exc:
        log.debug("flinkish: keeping Spark's default SPARK_HOME (cannot build %s: %s)", home, exc)
        return None
    return home


def _build(home: str, pyspark_dir: str) -> None:
    """Link every entry of ``pyspark_dir`` but ``python`` into ``home``, atomically."""
    parent = os.path.dirname(home)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".spark-home-", dir=parent)
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; other users of this cache may share it
    try:
        for name in os.listdir(pyspark_dir):
            if name != "python":
                os.symlink(os.path.join(pyspark_dir, name), os.path.join(tmp, name))
        if os.path.isdir(home):  # a broken leftover (its pyspark moved): replace it
            shutil.rmtree(home, ignore_errors=True)
        os.rename(tmp, home)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isfile(os.path.join(home, "bin", "spark-submit")):  # not built by a concurrent start either
            raise
