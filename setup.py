"""setuptools reads pyproject.toml; this file adds one thing it cannot declare: a ``.pth``
file at the top of site-packages (see ``poisonq-spark-python.pth``)."""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "poisonq-spark-python.pth"


class BuildWithPth(build_py):
    """``build_py``, and the ``.pth`` file beside the top-level modules it builds."""

    def run(self) -> None:
        super().run()
        self.copy_file(PTH, str(Path(self.build_lib, PTH)))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH))]


setup(cmdclass={"build_py": BuildWithPth})
