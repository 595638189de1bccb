"""deltalake and pyiceberg are optional: never imported with the package, one clear error when missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql.types import LongType, StructField, StructType

from flinkish_spark.errors import EnvironmentSetupError

SCHEMA = StructType([StructField("x", LongType())])


def test_importing_the_package_and_its_connectors_imports_neither_library() -> None:
    code = ("import sys, flinkish_spark, flinkish_spark.connectors, flinkish_spark.connectors.delta, "
            "flinkish_spark.connectors.iceberg; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('deltalake', 'pyiceberg')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_deltalake_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flinkish_spark.connectors.delta import DeltaSink

    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake -> ImportError
    with pytest.raises(EnvironmentSetupError, match=r"the flinkish.delta sink needs the Python package 'deltalake'.*"
                                                    r"pip install 'flinkish_spark\[delta\]'"):
        DeltaSink.at(str(tmp_path / "t"), uid="u", schema=SCHEMA)
    assert not (tmp_path / "t").exists()


def test_missing_pyiceberg_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from flinkish_spark.connectors.iceberg import IcebergSink

    monkeypatch.setitem(sys.modules, "pyiceberg", None)
    with pytest.raises(EnvironmentSetupError, match=r"the flinkish.iceberg sink needs the Python package 'pyiceberg'.*"
                                                    r"pip install 'flinkish_spark\[iceberg\]'"):
        IcebergSink.at("db.t", uid="u", schema=SCHEMA, checkpoint=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
