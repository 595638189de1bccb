"""What a Delta table's log names, for tests that check that nothing on storage is left unreferenced."""

from __future__ import annotations

import json
import urllib.parse

from flinkish_spark.connectors.delta.deletion_vectors import Descriptor
from flinkish_spark.io.fileio import FileIO


def referenced(io: FileIO, root: str) -> set[str]:
    """Every data file and deletion vector file (relative to the table root) any version of the log names."""
    out: set[str] = set()
    for path in io.find(f"{root.rstrip('/')}/_delta_log"):
        if not path.endswith(".json"):
            continue
        for line in io.read_bytes(io.url(path)).decode().splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            for kind in ("add", "remove"):
                if kind in action:
                    out.add(urllib.parse.unquote(action[kind]["path"]))
                    dv = action[kind].get("deletionVector")
                    if dv and dv["storageType"] == "u":
                        rel = Descriptor.from_json(dv).relative_file()
                        if rel:
                            out.add(rel)
    return out


def unreferenced(io: FileIO, root: str) -> set[str]:
    """Files below the table folder (outside ``_delta_log``) that no version of the log names."""
    base = io.strip(root).rstrip("/") + "/"
    on_storage = {p[len(base):] for p in io.find(root) if "/_delta_log/" not in p}
    return on_storage - referenced(io, root)


def log_mentions(io: FileIO, root: str, text: str) -> bool:
    """Whether any commit of the log holds ``text`` (e.g. '"deletionVector"')."""
    return any(text in io.read_bytes(io.url(p)).decode() for p in io.find(f"{root.rstrip('/')}/_delta_log") if p.endswith(".json"))
