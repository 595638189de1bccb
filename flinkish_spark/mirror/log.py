"""The log file of ``flinkish mirror``'s pipeline process: Spark's output there, the terminal for the user.

Spark's JVM inherits the pipeline process's standard error: its start-up warnings (``Using
incubator modules``, ``NativeCodeLoader``, ``DataSourceManager ... replaced``), log4j's
messages and the tasks' Python tracebacks all go there, and would break the live view. So,
before Spark starts, file descriptor 2 is pointed at :attr:`MirrorConfig.log_file` (appended,
one header per run) -- for the JVM and the Python workers it spawns as well -- and the lines meant
for the user go to the terminal's standard error through the stream :func:`to_log_file` returns.
With ``--verbose`` nothing is redirected.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from flinkish_spark.mirror.config import MirrorConfig


def to_log_file(config: MirrorConfig) -> TextIO:
    """Send this process's standard error (and its children's) to the log file; the terminal's stderr, for the user."""
    if config.verbose:
        return sys.stderr
    path = config.log_file
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    terminal = os.fdopen(os.dup(2), "w", buffering=1)
    sys.stderr.flush()
    os.dup2(fd, 2)
    os.close(fd)
    os.write(2, f"\n==== flinkish mirror {config.uid}: pipeline started {time.strftime('%Y-%m-%d %H:%M:%S %z')} "
                f"(pid {os.getpid()}) ====\n".encode())
    return terminal
