"""``format("poisonq")`` in a plain session of a virtualenv holding the wheel, its python
called by path without activating it. PySpark runs its Python workers with ``python3`` from
PATH unless ``PYSPARK_PYTHON`` says otherwise, and that interpreter has neither poisonq nor
the data source lookup's ``pyspark_poisonq``; the wheel's ``.pth`` file makes a virtualenv's
own interpreter the workers' default."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import poisonq
from tests.test_spark_autoregistration import PLAIN_SESSION

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.slow


def _built(out: Path) -> Path:
    """What a wheel of the checkout installs into site-packages: setuptools' build of it,
    offline (a wheel holds this tree)."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build", "--build-base", str(out)],
        cwd=ROOT, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out / "lib"


def _virtualenv(where: Path, built: Path) -> Path:
    """A fresh virtualenv with the built package in its site-packages, and this one's
    site-packages after it for the dependencies (a path line, whose own .pth files,
    such as the development install's, are not read)."""
    subprocess.run(
        [sys._base_executable, "-m", "venv", "--without-pip", str(where)],  # type: ignore[attr-defined]
        check=True, timeout=120,
    )  # fmt: skip
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    shutil.copytree(built, purelib, dirs_exist_ok=True)
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return python


def test_a_virtualenvs_python_called_by_path_resolves_the_format(tmp_path: Path) -> None:
    python = _virtualenv(tmp_path / "env", _built(tmp_path / "build"))
    url = f"sqlite:///{tmp_path / 'q.db'}"
    with poisonq.connect(url) as broker:
        broker.create_queue("orders")
        broker.sender("orders").send([poisonq.Message(body=b"a"), poisonq.Message(body=b"b")])
    script = tmp_path / "job.py"
    script.write_text(PLAIN_SESSION)
    # python3 on PATH is the base interpreter, without pyspark or poisonq.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys._base_executable)  # type: ignore[attr-defined]
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYSPARK_")}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/local/bin", "/usr/bin", "/bin"])
    done = subprocess.run(
        [str(python), str(script), url],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "['a', 'b']"
