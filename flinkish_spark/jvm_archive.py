"""Class data sharing for the driver JVM: Spark's classes mapped from an archive instead of read from jars.

A driver JVM spends most of its start loading, parsing and verifying the classes Spark
needs from its jars: on the project's 2-vCPU machine 15-20 s from process start to a
SparkSession with the flinkish sources registered and a first job run, 10-12 s when the
JVM maps those classes from a dynamic CDS archive (``-XX:SharedArchiveFile``, JDK 13+).
Every restart of a query pays that start, and so does every test that kills a driver.

:func:`build` makes the archive once per Java, PySpark and ``SPARK_HOME`` with its jars (each one's
name, size and time, as the JVM checks them: see :func:`_key`): a child process
runs a small streaming query with ``-XX:ArchiveClassesAtExit``, so that its JVM writes the
classes it loaded when it exits. The archive is moved into the cache only after that JVM
exited normally *and* a second JVM started with it: a truncated archive crashes the JVM
(``-Xshare:auto`` only covers a missing or mismatched one). :func:`driver_java_options`
returns the option that uses it, for :func:`flinkish_spark.session`, when an archive for
exactly this Java, PySpark and ``SPARK_HOME`` with these jars is in the cache with the size
recorded when it was verified. A new build deletes the archives no driver can use any more.

Guarantee: start-up speed only; nothing here changes what Spark computes. Without an
archive (never built, made for another Java or Spark, ``FLINKISH_JVM_ARCHIVE=0``) the
driver starts as it always did. Build it with ``flinkish jvm-archive``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Iterator

from flinkish_spark.worker_home import cache_root, fast_worker_spark_home

log = logging.getLogger(__name__)

ENV_SWITCH = "FLINKISH_JVM_ARCHIVE"  # "0": never use or build an archive


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def _key(java: str, spark_home: str) -> str:
    """What the archive depends on: the JVM build, the PySpark version and the driver's classpath.

    The classpath is each jar's name, size and modification time, as the JVM checks them: it refuses
    an archive whose jars changed ("The top archive failed to load", a warning only), and the driver
    then loads every class from the jars again. A venv installed anew at the same path (a CI checkout)
    keeps the names and gets new times, so names alone would hand its drivers an archive they refuse."""
    import pyspark

    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    jars = []
    for path in sorted(glob.glob(os.path.join(spark_home, "jars", "*.jar"))):
        st = os.stat(path)
        jars.append((os.path.basename(path), st.st_size, st.st_mtime_ns))
    material = json.dumps([os.path.realpath(java), version.stderr, pyspark.__version__,
                           os.path.realpath(spark_home), jars])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def _paths(java: str, spark_home: str) -> tuple[str, str]:
    import pyspark

    stem = os.path.join(cache_root(), f"jvm-{pyspark.__version__}-{_key(java, spark_home)}")
    return stem + ".jsa", stem + ".json"


def _verified(archive: str, record: str) -> bool:
    try:
        with open(record) as f:
            size = int(json.load(f)["size"])
        return os.path.getsize(archive) == size
    except (OSError, ValueError, KeyError, TypeError):
        return False


def driver_java_options(java: str, spark_home: str | None) -> str | None:
    """``-XX:SharedArchiveFile=...`` for the driver JVM, or ``None`` when there is no usable archive."""
    if not enabled() or not spark_home:
        return None
    try:
        archive, record = _paths(java, spark_home)
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("flinkish: no JVM class archive (%s)", exc)
        return None
    if not _verified(archive, record):
        return None
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto"


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """One builder at a time per archive (concurrent test sessions, two users of one cache)."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(java: str, timeout: float = 600.0) -> str | None:
    """Make (or find) the archive for local Spark sessions of this interpreter run by ``java``; return its path or ``None``.

    Never raises for a failed build: the driver then simply starts without an archive.
    """
    if not enabled():
        return None
    # The SPARK_HOME that flinkish_spark.session() gives local sessions of this interpreter.
    spark_home = os.environ.get("SPARK_HOME") or fast_worker_spark_home(os.environ.get("PYSPARK_PYTHON") or sys.executable)
    if not spark_home:
        return None
    archive, record = _paths(java, spark_home)
    if _verified(archive, record):
        return archive
    os.makedirs(os.path.dirname(archive), exist_ok=True)
    with _locked(archive + ".lock"):
        if _verified(archive, record):  # built by a concurrent caller meanwhile
            return archive
        fd, tmp = tempfile.mkstemp(prefix=".jvm-", suffix=".jsa", dir=os.path.dirname(archive))
        os.close(fd)
        os.unlink(tmp)  # the JVM writes it
        try:
            env = {**os.environ, ENV_SWITCH: "0", "SPARK_HOME": spark_home}
            dump = subprocess.run([sys.executable, "-c", "import sys; from flinkish_spark.jvm_archive_dump import dump; dump(sys.argv[1])", tmp], env=env,
                                  capture_output=True, text=True, timeout=timeout)
            if dump.returncode != 0 or not os.path.isfile(tmp):
                log.warning("flinkish: could not build the JVM class archive (exit %s): %s", dump.returncode,
                            (dump.stderr.strip().splitlines() or ["?"])[-1])
                return None
            # A damaged archive crashes the JVM that maps it: try it before anyone relies on it.
            probe = subprocess.run([java, f"-XX:SharedArchiveFile={tmp}", "-Xshare:auto", "-version"],
                                   capture_output=True, text=True, timeout=120)
            if probe.returncode != 0:
                log.warning("flinkish: the JVM class archive does not load; not used: %s", probe.stderr.strip()[-500:])
                return None
            size = os.path.getsize(tmp)
            os.replace(tmp, archive)
            with open(record + ".tmp", "w") as f:
                json.dump({"size": size, "java": java, "sparkHome": spark_home}, f)
            os.replace(record + ".tmp", record)
            _remove_stale(record, spark_home)
            return archive
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("flinkish: could not build the JVM class archive: %s", exc)
            return None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _remove_stale(kept: str, spark_home: str) -> None:
    """Delete the archives no driver can use any more (~180 MB each): made for this ``SPARK_HOME`` before its jars
    changed, or for a ``SPARK_HOME`` that is gone (a deleted checkout). A JVM that maps one keeps its mapping."""
    for other in glob.glob(os.path.join(os.path.dirname(kept), "jvm-*.json")):
        if other == kept:
            continue
        try:
            with open(other) as f:
                home = str(json.load(f)["sparkHome"])
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge
        if home == spark_home or not os.path.isfile(os.path.join(home, "bin", "spark-submit")):
            stem = other[: -len(".json")]
            for path in (stem + ".jsa", other, stem + ".jsa.lock"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
