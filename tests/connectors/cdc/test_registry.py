"""The registry of a multi-table source (no server): immutable versioned files, a name per content, the
dialect's signature kept as it gave it."""

from __future__ import annotations

from pathlib import Path

from flinkish_spark.connectors.cdc import registry
from flinkish_spark.connectors.cdc.registry import Registry, TableEntry
from flinkish_spark.io.fileio import FileIO


def test_a_registry_file_round_trips_and_its_name_follows_its_content(tmp_path: Path) -> None:
    io, folder = FileIO.for_url(str(tmp_path)), str(tmp_path)
    sig = [16384, [[1, "id", False], [2, "v", True]], None]  # a dialect's signature, opaque to the core
    reg = Registry().with_entries([TableEntry(0, 16384, "public", "t", "snapshot", key=("id",), signature=sig)], 1)
    name = registry.write(io, folder, reg)
    back = registry.read(io, folder, name)
    assert back == reg and back.entries[0].signature == sig and back.entries[0].name == "public.t"
    assert registry.write(io, folder, back) == name  # the same content, the same file
    renewed = reg.with_entries([reg.entries[0].with_state("streaming")])
    assert renewed.version == reg.version + 1 and registry.write(io, folder, renewed) != name
    registry.retain(io, folder, renewed.version)
    assert sorted(p.name for p in (tmp_path / registry.FOLDER).iterdir()) == [renewed.file_name]
