"""The Python examples of README.md and of every docs/*.md page run as written.
Each block runs alone, in a fresh directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# design.md is the founding design: its API sketch is not a runnable example.
PAGES = [README, *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "design.md")]


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


def _name(page: Path) -> str:
    return "README" if page == README else page.name


BLOCKS = [(page, i, block) for page in PAGES for i, block in enumerate(_blocks(page))]


def test_the_readme_has_examples() -> None:
    assert len(_blocks(README)) >= 2


# The examples that start Spark are marked for the fast tier to leave out.
EXAMPLES = [
    pytest.param(
        page,
        block,
        id=f"{_name(page)}-block{i}",
        marks=[pytest.mark.spark] if "spark" in block else [],
    )
    for page, i, block in BLOCKS
]


@pytest.mark.parametrize(("page", "block"), EXAMPLES)
def test_readme_example_runs(
    page: Path, block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(page), "exec"), {"__name__": "readme"})
