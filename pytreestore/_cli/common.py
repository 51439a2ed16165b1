"""What every ``pytreestore`` command shares: the command group, its common options, opening
a store without its classes, failing with a message, and JSON output.

Failing is done in one place: every command is a :class:`Command`, which turns a
:class:`~pytreestore.errors.PyTreeStoreError` (a store missing, damaged, not a store, refused)
or an ``OSError`` (permission denied, a name too long, ...) into one line on standard error,
``pytreestore: error: ...``, and exit status 2. Any other exception is a bug of pytreestore's
and keeps its traceback.

Example:
    >>> jsonable({"a": (1, 2.5), "b": None})
    {'a': [1, 2.5], 'b': None}
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import numpy as np

import pytreestore
from pytreestore._inspect import progress as _progress
from pytreestore._open.standins import open_without_classes
from pytreestore.errors import PyTreeStoreError

EXIT_PROBLEMS = 1
EXIT_ERROR = 2

json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on standard error (default: when it is a terminal).",
)


class Command(click.Command):
    """A ``pytreestore`` command: a store that cannot be opened, read or written ends it with
    a message and status 2, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PyTreeStoreError as err:
            fail(str(err))
        except OSError as err:  # raised by the operating system, not by pytreestore
            fail(os_message(err, ctx))


def os_message(err: OSError, ctx: click.Context) -> str:
    """``err`` in one line: the file it names (else the command's paths), and its reason."""
    if err.filename is not None:
        where = os.fsdecode(err.filename)
    else:
        where = " -> ".join(str(ctx.params[k]) for k in ("path", "src", "dst") if k in ctx.params)
    reason = err.strerror or str(err) or type(err).__name__
    return f"{where}: {reason}" if where else reason


class _Group(click.Group):
    command_class = Command


@click.group(
    cls=_Group,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(pytreestore.__version__, prog_name="pytreestore")
def main() -> None:
    """Look into, check and copy pytreestore stores.

    A store is a directory, or an s3:// or gs:// URL, holding one zarr v3 array per leaf of
    its records. Run `pytreestore COMMAND --help` for each command's options.
    """


@contextmanager
def opened(path: str) -> Iterator[pytreestore.TreeStore]:
    """The store at ``path``, read-only, without its classes (the generic view, or
    stand-ins for a ragged store's classes); a store that won't open is an error."""
    with open_without_classes(path) as store:
        yield store


def fail(message: str) -> NoReturn:
    click.echo(f"pytreestore: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def show_progress(flag: bool | None) -> bool:
    return _progress.default_enabled() if flag is None else flag


def print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, allow_nan=True))


def problem_json(problem: Any) -> Any:
    if dataclasses.is_dataclass(problem) and not isinstance(problem, type):
        return {k: jsonable(v) for k, v in dataclasses.asdict(problem).items()}
    return str(problem)


def jsonable(value: Any) -> Any:
    """Plain JSON values for a tree of dicts, lists, tuples, None and numpy values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "c":
        return jsonable(np.stack([np.real(array), np.imag(array)], axis=-1))
    if array.dtype.kind not in "biu" and array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float32)  # float16, bfloat16, float8: exact in float32
    return array.tolist()


__all__ = [
    "EXIT_ERROR",
    "EXIT_PROBLEMS",
    "Command",
    "fail",
    "json_option",
    "jsonable",
    "main",
    "opened",
    "os_message",
    "print_json",
    "problem_json",
    "progress_option",
    "show_progress",
]
