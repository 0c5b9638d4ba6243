"""File and directory parameters that refuse a path the file system cannot name.

A program (not a shell: a shell hands undecodable bytes over as escapes the file system
accepts) may pass a lone surrogate; ``open`` and ``stat`` then raise ``UnicodeEncodeError``,
which would be a traceback instead of one red line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]  # generic from click 8.3 on
else:
    _ParamType = click.ParamType


class _Nameable(_ParamType):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except UnicodeEncodeError:
            self.fail(f"{value!r} is not a path this system can name", param, ctx)


class FileParam(_Nameable, click.File):
    """``click.File``, refusing a path that cannot be named."""


class PathParam(_Nameable, click.Path):
    """``click.Path``, refusing a path that cannot be named."""
