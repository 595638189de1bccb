"""``flinkish mirror compare``: is a caught-up mirror equal to its source? From the shell, with the mirror's own flags.

``flinkish mirror compare --from ... --tables ... --to ... [--format ...] [--sink-option K=V]`` (or
``flinkish mirror compare pipeline.yaml``) takes the configuration ``flinkish mirror`` takes -- the same
command line with ``compare`` after ``mirror`` -- and compares every matching source table with its
target row by row (:func:`flinkish_spark.mirror.compare.compare_mirror`): one line per table with the
rows on both sides and the keys missing from the target, extra in it, and different. Exit 0 only
when every table is equal, 1 otherwise (2: a bad flag). Read only; run it on a mirror that has caught
up (drained, or its source idle: a table that changes while it is read differs by what is not mirrored
yet).
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

from flinkish_spark.errors import ConfigError
from flinkish_spark.mirror.compare import TableComparison
from flinkish_spark.mirror.config import MirrorConfig

#: --checkpoint is optional here: only the embedded Iceberg catalog lives in the metadata root.
_NO_CHECKPOINT = "none://no-checkpoint"  # a URL: config.absolute() leaves it as it is
HEADER = ("table", "source rows", "target rows", "missing", "extra", "different", "result")


def _row(r: TableComparison) -> tuple[str, ...]:
    target = "-" if r.target_rows is None else str(r.target_rows)
    missing, extra, different = (str(len(k)) for k in (r.missing, r.extra, r.different))
    return r.table, str(r.source_rows), target, missing, extra, different, "equal" if r.equal else r.summary()


def report(results: list[TableComparison]) -> list[str]:
    """The lines ``flinkish mirror compare`` prints: a header, one aligned line per table, a closing line."""
    rows = [HEADER, *(_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER) - 1)]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             + "  " + row[-1] for row in rows]
    differ = sum(1 for r in results if not r.equal)
    if not results:
        lines.append("flinkish mirror compare: no source table matches --tables")
    elif differ:
        lines.append(f"flinkish mirror compare: {differ} of {len(results)} tables differ from their source")
    else:
        lines.append(f"flinkish mirror compare: all {len(results)} tables equal to their source")
    return lines


def run_compare(args: argparse.Namespace, config_of: Callable[[argparse.Namespace], MirrorConfig]) -> int:
    """``flinkish mirror compare``: the flags (or the pipeline file) describe the mirror to check, read by
    ``config_of`` (:func:`flinkish_spark.mirror.cli.config_of`)."""
    from flinkish_spark.mirror.compare import compare_mirror

    given = dict(vars(args))
    if not args.pipeline and not args.checkpoint:
        given["checkpoint"] = _NO_CHECKPOINT
    config = config_of(argparse.Namespace(**given))
    sink = config.sink_options()
    if sink["checkpoint"] == _NO_CHECKPOINT and config.format == "iceberg" and not (
            "catalog" in sink or "catalogUri" in sink):
        raise ConfigError("flinkish mirror compare: an Iceberg mirror without 'catalog' or 'catalogUri' has its "
                          "catalog in its metadata root: give the mirror's --checkpoint")
    os.environ.update(config.password_env())  # the connectors' passwordEnv, as the pipeline process gets them
    results = compare_mirror(config)
    for line in report(results):
        print(line, flush=True)
    return 0 if results and all(r.equal for r in results) else 1
