"""The package type-checks (mypy, settings in setup.cfg), so CI keeps it that way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_package_is_mypy_clean() -> None:
    out = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "flinkish_spark"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
