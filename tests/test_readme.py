"""The README's Python examples run as written (STYLE rule 10)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


# The examples that start Spark are marked for the fast tier to leave out.
EXAMPLES = [
    pytest.param(block, id=f"block{i}", marks=[pytest.mark.spark] if "spark" in block else [])
    for i, block in enumerate(BLOCKS)
]


@pytest.mark.parametrize("block", EXAMPLES)
def test_readme_example_runs(block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(README), "exec"), {"__name__": "readme"})
