"""What ``flinkish mirror`` says when its query fails: the cause in one line, advice that fits it.

Spark wraps an exception raised in a Python worker or data source in its own
(``[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] ... Traceback (most recent call last): ...``,
then dozens of Java frames). :func:`cause` finds the Python exception in that text -- the one the
code raised, ``Name: message`` with the module path dropped -- so that the last line the user
reads is ``InsufficientPrivilege: permission denied for table orders``, not the wrapper; the full
text goes to the mirror's log file.
"""

from __future__ import annotations

import re
import socket

_TRACEBACK = "Traceback (most recent call last):"
#: An exception line of a Python traceback: ``package.module.Name: message`` (or the name alone) at column 0.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")
#: Exceptions that a later run may not meet again (the same command, once the server or store answers).
_TRANSIENT = ("DatabaseUnavailableError", "StorageUnavailableError", "CommitRetryExhaustedError", "OperationalError")


def cause(text: str) -> str:
    """``Name: message`` of the Python exception in Spark's error ``text`` (the last traceback's); else the line
    of a flinkish error, or the first line."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.strip() == _TRACEBACK or ln.endswith(_TRACEBACK)]
    if starts:
        seen_frame = False
        for ln in lines[starts[-1] + 1:]:
            if ln.startswith("  "):  # a frame ("  File ...") or its source line
                seen_frame = True
                continue
            m = _EXCEPTION.match(ln.strip())
            if seen_frame and m and not ln.startswith("\t"):
                name = m.group(1).rsplit(".", 1)[-1]
                return f"{name}: {m.group(2).strip()}" if m.group(2) else name
    stripped = [ln.strip() for ln in lines if ln.strip()]
    flinkish = [ln for ln in stripped if ln.startswith("flinkish_spark.") or ("Error: " in ln and "flinkish" in ln.lower())]
    return (flinkish or stripped or [text])[0]


def cause_of(exc: object, text: str) -> str:
    """The cause of a failure ``exc`` whose (password-masked) text is ``text``: Spark's errors through
    :func:`cause`; an exception raised in this process outside Spark (starting it, the progress view) as is."""
    if isinstance(exc, BaseException) and not type(exc).__module__.startswith(("pyspark", "py4j")):
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return cause(text)


def advice(root: str, text: str) -> str:
    """What to do about a failure whose cause is ``root`` (full Spark text ``text``)."""
    name = root.split(":", 1)[0]
    if name == "FencedError":
        return _fenced(text)
    if name in _TRANSIENT:
        return ("a transient failure: once the server or the store answers again, run the same command: it "
                "continues from the checkpoint (the last committed epoch)")
    return "fix the cause and run the same command again: it continues from the checkpoint (the last committed epoch)"


def _fenced(text: str) -> str:
    """Another run holds the lease: name the ``flinkish mirror`` process to stop, not Spark's worker."""
    m = re.search(r"on host (\S+) pid (\d+)", text)
    if m is None:
        return "another run of this mirror holds its checkpoint: stop it first (this one ended; nothing is lost)"
    host, pid = m.group(1), int(m.group(2))
    if host != socket.gethostname():  # as the lease records it
        return (f"another run of this mirror holds its checkpoint, on host {host}: stop the flinkish mirror "
                "there first (this one ended; nothing is lost)")
    command = mirror_command(pid)
    if command is None:
        return (f"another run of this mirror holds its checkpoint (process {pid} on this host): stop it first "
                "(this one ended; nothing is lost)")
    mpid, line = command
    return (f"another flinkish mirror runs on this checkpoint: pid {mpid} ({line}). Stop it first (Ctrl-C in its "
            f"terminal, or kill -TERM {mpid}); this one ended, nothing is lost")


def mirror_command(pid: int) -> tuple[int, str] | None:
    """The ``flinkish mirror`` command (pid, command line) that ``pid`` -- a driver JVM or Spark Python worker --
    runs under: the parent of its ``python -m flinkish_spark.mirror.pipeline`` ancestor."""
    while pid > 1:
        line = _cmdline(pid)
        if line is None:
            return None
        if "flinkish_spark.mirror.pipeline" in line:
            parent = _parent(pid)
            parent_line = _cmdline(parent) if parent else None
            return (parent, parent_line) if parent and parent_line else (pid, line)
        pid = _parent(pid) or 0
    return None


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
