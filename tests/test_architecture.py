"""The package reads as layers: no import cycles between modules, production code never imports testing/."""

from __future__ import annotations

import ast
from pathlib import Path

import flinkish_spark

PACKAGE = Path(flinkish_spark.__file__).parent


def _imports() -> dict[str, set[str]]:
    """Module name -> the flinkish_spark modules it imports (at any depth in the file)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flinkish_spark"):
                targets.add(node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("flinkish_spark"))
        graph[name] = targets
    return graph


def test_production_code_never_imports_testing() -> None:
    offenders = {m: sorted(t for t in ts if t.startswith("flinkish_spark.testing"))
                 for m, ts in _imports().items() if not m.startswith("flinkish_spark.testing")}
    assert {m: ts for m, ts in offenders.items() if ts} == {}


def test_no_import_cycle_between_submodules() -> None:
    """Ignores package __init__ re-exports (a package importing its own children is no cycle)."""
    graph = _imports()
    edges = {m: {t for t in ts if t in graph and not m.startswith(t + ".") and t != m}
             for m, ts in graph.items() if not PACKAGE.joinpath(*m.split(".")[1:], "__init__.py").exists()}
    modules = {m: {t for t in ts if t in edges} for m, ts in edges.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in modules[m]:
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(modules):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_a_python_worker_loading_a_builtin_data_source_imports_neither_pandas_nor_sqlglot() -> None:
    """Spark starts a Python worker per kind of planning call of every query (lookup, create, write, the streaming
    source runner, the commit runner): each unpickles the data source class and so imports its module. pandas (~0.35 s
    of CPU) comes with the first Arrow array built from Python values, sqlglot (~0.1 s) with the transforms' parser;
    neither is needed to plan, so no module a built-in data source's class lives in may pull them in at import."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import pyspark.sql.worker.create_data_source\n"
        "from flinkish_spark.connectors.builtin import BUILTIN_SINKS, BUILTIN_SOURCES\n"
        "import importlib\n"
        "for cls in (*BUILTIN_SOURCES, *BUILTIN_SINKS):\n"
        "    importlib.import_module(cls.__module__)\n"
        "print(sorted(m for m in ('pandas', 'sqlglot') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"imported at a worker's start: {out.stdout.strip()}"
