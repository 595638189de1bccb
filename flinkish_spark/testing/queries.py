"""Several pipeline specs one after the other in ONE child driver, for tests whose driver start is the cost.

``python -m flinkish_spark.testing.queries SPEC.json`` with ``{"queries": [spec, spec, ...]}``: each spec is what
``python -m flinkish_spark.runner`` runs (:func:`flinkish_spark.runner.run`), in order, in the same Spark session
(the first spec's ``master`` and ``conf`` start it; later ones get that session). Before each query it prints
``QUERY <i>/<n>``, so that a test can tell which ``QUERY_END=`` line is whose. A failed query ends the process
(non-zero), the later ones are not run.

Why: a ``local-cluster[2,1,1024]`` driver starts a driver JVM and two executor JVMs with their Python workers --
~20-30 s on two shared cores. Checks that only need "a query on separate executor JVMs" share one start
(tests/test_local_cluster.py). Every query still plans, runs and ends on its own; only the JVMs are reused, as in
any long-running application that runs several queries.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def run_all(specs: list[dict[str, Any]]) -> None:
    from pyspark.sql import SparkSession

    from flinkish_spark import runner

    stop = SparkSession.stop
    for i, spec in enumerate(specs, start=1):
        print(f"QUERY {i}/{len(specs)}", flush=True)
        # The runner stops its session when its query ended; the next spec needs it still running.
        SparkSession.stop = stop if i == len(specs) else (lambda self: None)  # type: ignore[method-assign]
        try:
            runner.run(spec)
        finally:
            SparkSession.stop = stop  # type: ignore[method-assign]


def outputs(output: str) -> list[str]:
    """The output of each query of a run, in order (what a process printed before its first query is dropped)."""
    parts = output.split("\nQUERY ")
    if output.startswith("QUERY "):
        parts = ["", output[len("QUERY "):]] + parts[1:]
    return [p.split("\n", 1)[1] if "\n" in p else "" for p in parts[1:]]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m flinkish_spark.testing.queries SPEC.json")
    with open(args[0]) as f:
        run_all(json.load(f)["queries"])


if __name__ == "__main__":
    main()
