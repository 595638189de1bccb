"""In-process kills: a test makes a named crash point of a module raise, as a kill -9 there would stop the process.

:class:`Killed` is a ``BaseException``: no ``except Exception`` of the code under test (a sink's maintenance,
a retry loop) can swallow it, so nothing after the point runs -- what a restart then finds on storage is what a
killed process leaves. Production code calls :func:`flinkish_spark.faults.crash_point` by name; the child-driver
crash tests kill a real process there (``run_pipeline(..., crash_at=...)``), these tests replace it in process.
"""

from __future__ import annotations

from typing import Any


class Killed(BaseException):
    """kill -9 at a crash point."""


def kill_at(monkeypatch: Any, module: Any, point: str) -> None:
    """From now on ``module``'s ``crash_point(point)`` raises :class:`Killed` (every other point passes)."""
    def crash(name: str) -> None:
        if name == point:
            raise Killed

    monkeypatch.setattr(module, "crash_point", crash)
