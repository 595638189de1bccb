"""Lazy re-exports for the package ``__init__`` modules (PEP 562).

Every Python worker Spark starts -- for each query: the data source lookup, planning, the
streaming source runner, the sink's commit, every forked task worker -- imports the module of
the data source class it unpickles, and with it every ``__init__`` above that module. When
those re-exported everything eagerly, a worker running ``flinkish.sequence`` also imported the
Delta, Iceberg, PostgreSQL and Parquet sinks, the finish controller and pyarrow.compute:
importing ``flinkish_spark.connectors.sequence`` after pyspark, pyarrow and pandas took 0.16 s
of CPU, now 0.08 s (see docs/testing.md). Names are now imported on first access instead.

Guarantee: ``package.Name`` and ``from package import Name`` return the same object as before;
only the moment of the import moves. Type checkers read the ``TYPE_CHECKING`` imports beside
each table (they never see ``__getattr__``, so a misspelt name is still an error).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: each name of ``names`` is taken from the module it maps to."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain attribute lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
