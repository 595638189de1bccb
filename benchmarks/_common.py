"""Shared bits of the benchmark scripts: machine description, table printing, JSON results."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
import shutil
import tempfile
from typing import Any, Callable, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))


def machine() -> dict[str, Any]:
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except OSError:
        java = "?"
    import pyspark

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": java,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    line = " | ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def write_results(name: str, payload: dict[str, Any]) -> str:
    path = os.path.join(HERE, "results", f"{name}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"machine": machine(), **payload}, f, indent=2)
    return path


def per_table_count(counts: str, prefix: str, run: Callable[[str, int, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """``run(url, n, work)`` for each n of ``counts`` ("10,100,1000") on one embedded PostgreSQL in a
    temporary folder ``work``, removed afterwards."""
    from flinkish_spark.embedded.postgres import start_postgres

    work = tempfile.mkdtemp(prefix=prefix)
    pg = start_postgres(os.path.join(work, "data"))
    results = []
    try:
        for n in (int(x) for x in counts.split(",")):
            results.append(run(pg.uri, n, work))
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results
