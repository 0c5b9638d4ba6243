"""The package's public names: all of them resolve, and importing the package loads little."""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import poisonq


@pytest.mark.parametrize("name", poisonq.__all__)
def test_every_public_name_resolves_to_its_module_object(name: str) -> None:
    value = getattr(poisonq, name)
    # A class or function names its module; an alias such as Settlement (a union) does not.
    home = sys.modules[getattr(value, "__module__", "poisonq.model")]
    if not home.__name__.startswith("poisonq."):
        home = sys.modules["poisonq.model"]
    assert getattr(home, name) is value
    assert name in dir(poisonq)


def test_an_unknown_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Brokerr'"):
        poisonq.Brokerr  # noqa: B018


def _loaded_after(code: str) -> set[str]:
    """The poisonq modules (and heavy dependencies) a fresh interpreter has after ``code``."""
    probe = (
        f"{code}\nimport json, sys\n"
        "print(json.dumps([m for m in sys.modules"
        " if m.startswith(('poisonq', 'psycopg', 'sqlite3', 'rich', 'click'))]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return set(json.loads(out))


def test_importing_the_package_or_an_error_loads_neither_client_nor_stores() -> None:
    # What the crash guard's helper does when it unpickles a transform that raises
    # poisonq.PermanentError: it must stay small, it forks a child per crash.
    assert _loaded_after("import poisonq") == {"poisonq"}
    loaded = _loaded_after("import poisonq; poisonq.PermanentError")
    assert loaded == {"poisonq", "poisonq.errors"}


def test_the_client_loads_when_first_used() -> None:
    loaded = _loaded_after("import poisonq; poisonq.connect")
    assert {"poisonq.client", "poisonq.engine"} <= loaded


def test_the_makefile_runs_the_virtualenvs_tools() -> None:
    """Every recipe calls the virtualenv's tools by a path with no stray spaces (make keeps
    the spaces before a comment in a variable's value)."""
    root = Path(__file__).resolve().parents[1]
    planned = subprocess.run(
        ["make", "-n", "-C", str(root), "check"], capture_output=True, text=True, check=False
    ).stdout
    tools = [line.split()[0] for line in planned.splitlines() if "ruff" in line or "mypy" in line]
    assert tools and all(tool.startswith(".venv/bin/") for tool in tools), planned


def test_the_processor_imports_without_the_spark_extras_cloudpickle() -> None:
    """cloudpickle comes with the ``spark`` extra: the crash guard imports it when it starts
    a helper, so ``import poisonq`` and the Processor work without it."""
    probe = (
        "import sys; sys.modules['cloudpickle'] = None\n"
        "import poisonq; from poisonq import Processor; import poisonq.worker.guard\n"
        "print(Processor.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Processor"


def _module_imports() -> dict[str, set[str]]:
    """Each module of the package, with the package's modules it imports at its top level,
    also under ``if TYPE_CHECKING:`` (a cycle of types is still a cycle for its reader), but
    not the packages it belongs to (a submodule may name its package's public objects)."""
    root = Path(poisonq.__file__).parent
    files = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        blocks = [n.body if isinstance(n, ast.If) else [n] for n in tree.body]
        imported: set[str] = set()
        for node in (n for block in blocks for n in block):
            if isinstance(node, ast.ImportFrom) and node.module:
                wanted = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            else:
                continue
            imported.update(w for w in wanted if w in files)
        graph[name] = {m for m in imported if m != name and not name.startswith(f"{m}.")}
    return graph


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    """Each layer and each object reads on its own: a receiver does not import the client
    that makes it, nor a sender its broker (they are handed what they use)."""
    try:
        graphlib.TopologicalSorter(_module_imports()).prepare()
    except graphlib.CycleError as cycle:
        pytest.fail(f"an import cycle: {' -> '.join(cycle.args[1])}")
