"""Which Iceberg catalog the sink talks to, made once per process.

Options: ``catalog`` names a pyiceberg catalog (``.pyiceberg.yaml`` or
``PYICEBERG_CATALOG__<NAME>__*`` variables); or ``catalogUri`` (+ ``warehouse``) makes a
SQL catalog; without either, an embedded SQL catalog on SQLite lives in the sink's
checkpoint folder (``<checkpoint>/iceberg/catalog.db``, warehouse
``<checkpoint>/iceberg/warehouse``; local checkpoint folders only).

A pyiceberg SQL catalog files every table under the catalog's *name* (the
``catalog_name`` column of its ``iceberg_tables``): a reader that loads the same database
under another name sees no tables. ``catalogName`` (default ``flinkish``) sets that name
for the ``catalogUri`` and embedded catalogs, so that the sink and the users' own
``SqlCatalog("<name>", ...)`` meet; a configured ``catalog`` has its own name.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from flinkish_spark.checkpoint.layout import join
from flinkish_spark.connectors.lakehouse.files import iceberg_io_properties, require
from flinkish_spark.errors import ConfigError
from flinkish_spark.io.fileio import protocol_of, storage_options_from

EXTRA = "iceberg"
DEFAULT_CATALOG_NAME = "flinkish"


def pyiceberg() -> Any:
    return require("pyiceberg", EXTRA, "the flinkish.iceberg sink")


def identifier(table: str | None, component: str) -> str:
    if not table or "." not in table.strip(".") or any(not part for part in table.split(".")):
        raise ConfigError(f"{component}: 'table' must be namespace.name (e.g. 'db.orders'), got {table!r}")
    return table


def catalog_properties(catalog: str | None, catalog_uri: str | None, warehouse: str | None, checkpoint: str | None,
                       options: dict[str, str], component: str, catalog_name: str | None = None) -> dict[str, str]:
    """pyiceberg catalog properties for the options, with the storage options in pyiceberg's form."""
    pyiceberg()
    from pyiceberg.utils.config import Config

    if catalog and catalog_uri:
        raise ConfigError(f"{component}: set either 'catalog' or 'catalogUri', not both")
    if catalog_name is not None and not catalog_name.strip():
        raise ConfigError(f"{component}: 'catalogName' must not be empty (default {DEFAULT_CATALOG_NAME!r})")
    if catalog:
        if catalog_name is not None and catalog_name != catalog:
            raise ConfigError(
                f"{component}: 'catalogName' names the SQL catalog made from 'catalogUri' or the embedded one; "
                f"the configured catalog {catalog!r} files its tables under its own name. Drop 'catalogName', "
                "or rename the catalog in .pyiceberg.yaml")
        config = Config()
        if config.get_catalog_config(catalog) is None:
            known = config.get_known_catalogs()
            raise ConfigError(
                f"{component}: unknown Iceberg catalog {catalog!r}: no entry in .pyiceberg.yaml or "
                f"PYICEBERG_CATALOG__{catalog.upper()}__* variables (known: {known or 'none'}). Configure it, or "
                "use 'catalogUri' and 'warehouse' for a SQL catalog."
            )
        props: dict[str, str] = {"name": catalog}
        if warehouse:
            props["warehouse"] = warehouse
    elif catalog_uri:
        if not warehouse:
            raise ConfigError(f"{component}: 'catalogUri' needs 'warehouse' (where the table data goes)")
        props = {"name": catalog_name or DEFAULT_CATALOG_NAME, "type": "sql", "uri": catalog_uri, "warehouse": warehouse}
    else:
        if not checkpoint or protocol_of(checkpoint) not in ("file", "local"):
            raise ConfigError(
                f"{component}: the embedded Iceberg catalog (SQLite) needs a local checkpoint folder, got "
                f"{checkpoint!r}; set 'catalog' or 'catalogUri' + 'warehouse' for tables on S3"
            )
        root = checkpoint[len("file://"):] if checkpoint.startswith("file://") else checkpoint
        folder = os.path.abspath(join(root, "iceberg"))
        os.makedirs(folder, exist_ok=True)
        props = {"name": catalog_name or DEFAULT_CATALOG_NAME, "type": "sql", "uri": f"sqlite:///{folder}/catalog.db",
                 "warehouse": warehouse or f"file://{folder}/warehouse"}
    where = props.get("warehouse")
    if where and protocol_of(where) == "s3":
        props.update(iceberg_io_properties(storage_options_from(options, where)))
    return props


_CATALOGS: dict[str, Any] = {}
_LOCK = threading.Lock()


def load(properties: dict[str, str]) -> Any:
    """The catalog for ``properties``, made once per process: a SQL catalog builds an engine, a REST one logs in."""
    pyiceberg()
    from pyiceberg.catalog import load_catalog

    key = json.dumps(properties, sort_keys=True)
    with _LOCK:
        catalog = _CATALOGS.get(key)
        if catalog is None:
            props = dict(properties)
            name = props.pop("name")
            catalog = _CATALOGS[key] = load_catalog(name, **props)
        return catalog


def names_holding(catalog: Any, table: str) -> list[str]:
    """The other catalog names a SQL catalog's database files ``table`` under (empty for other catalogs)."""
    try:
        from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
        from sqlalchemy import select
        from sqlalchemy.orm import Session
    except ImportError:
        return []
    if not isinstance(catalog, SqlCatalog):
        return []
    namespace, name = table.rsplit(".", 1)
    with Session(catalog.engine) as session:
        rows = session.execute(select(IcebergTables.catalog_name).where(
            IcebergTables.table_namespace == namespace, IcebergTables.table_name == name)).scalars().all()
    return sorted(str(r) for r in rows if r != catalog.name)
