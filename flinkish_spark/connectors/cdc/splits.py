"""Split ids of the ``flinkish.postgres`` source: ``snapshot-<g>-<n>`` chunks and the ``changes-<g>`` split.

``g`` is the generation: a new slot and a new snapshot after a lost slot start the next one.
A multi-table source's chunks are ``snapshot-<g>-t<tid>-<n>`` (``tid``: the table's number in
its registry, never reused).
"""

from __future__ import annotations


def chunk_id(generation: int, n: int) -> str:
    return f"snapshot-{generation}-{n:05d}"


def changes_id(generation: int) -> str:
    return f"changes-{generation}"


def split_generation(split_id: str) -> int:
    return int(split_id.split("-")[1])


def table_chunk_id(generation: int, tid: int, n: int) -> str:
    return f"snapshot-{generation}-t{tid}-{n:05d}"


def table_of_chunk(split_id: str) -> int:
    """The ``tid`` of a multi-table chunk id."""
    return int(split_id.split("-")[2][1:])
