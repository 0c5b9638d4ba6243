"""The docs/ site builds: mkdocs in strict mode fails on a broken internal link or anchor, or
a nav entry without its file; and the README's links resolve."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()


def _slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (its default ``toc`` slugify)."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).strip().replace(" ", "-")


def test_readme_links_resolve() -> None:
    """mkdocs checks the site's links; the README, outside the site, is checked here: every
    relative link names a file of the checkout, and its anchor a heading of that file."""
    readme = (ROOT / "README.md").read_text()
    links = [link for link in re.findall(r"\]\(([^)]+)\)", readme) if "://" not in link]
    assert links
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(), re.M)
            assert anchor in [_slug(h) for h in headings], link
