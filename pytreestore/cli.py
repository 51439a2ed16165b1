"""The ``pytreestore`` command: look into stores, check them and copy them from a shell.

``pytreestore info PATH`` draws the column tree with dtypes, shapes, chunks and sizes;
``head PATH -n N`` prints the first records; ``verify PATH`` checks every column against the
commit; ``versions PATH`` lists the store's versions; ``copy SRC DST`` rechunks, recompresses,
repacks or moves a store. Every command takes ``--help``; ``info``, ``head``, ``verify``, ``versions``
and ``copy`` take ``--json`` for scripts.

Exit status: 0 on success, 1 when ``verify`` finds problems, 2 for a usage error or a store
that cannot be opened or written.

Example:
    >>> from click.testing import CliRunner
    >>> result = CliRunner().invoke(main, ["--help"])
    >>> result.exit_code, "info" in result.output
    (0, True)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import numpy as np

import pytreestore
from pytreestore._format.packs import PACK_LEAF_BYTES
from pytreestore._inspect import progress as _progress
from pytreestore._inspect import repr as _repr
from pytreestore._inspect.records import format_record, record_items, static_fields, summary_lines
from pytreestore._open.copy import KEEP
from pytreestore._open.open import open_any
from pytreestore._read.reader import load_leaves
from pytreestore._read.request import LoadRequest
from pytreestore.errors import CorruptStoreError, NotAStoreError, PyTreeStoreError

EXIT_PROBLEMS = 1
EXIT_ERROR = 2
_CODECS = ("zstd", "blosc", "gzip", "none", KEEP)
_PACK_WORDS: dict[str, bool | str] = {"keep": KEEP, "off": False, "on": True}  # --pack N too

_json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_progress_option = click.option(
    "--progress/--no-progress",
    default=None,
    help="Show a progress bar on standard error (default: when it is a terminal).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(pytreestore.__version__, prog_name="pytreestore")
def main() -> None:
    """Look into, check and copy pytreestore stores.

    A store is a directory, or an s3:// or gs:// URL, holding one zarr v3 array per leaf of
    its records. Run `pytreestore COMMAND --help` for each command's options.
    """


# ---- info -------------------------------------------------------------------------------------


@main.command()
@click.argument("path")
@_json_option
def info(path: str, as_json: bool) -> None:
    """Show a store's column tree: dtype, per-record shape, chunks, bytes and compression.

    The headline gives the record count, format version, chunking and codec, and the sizes:
    'data' is the records' uncompressed bytes, 'stored' the bytes of their chunks on disk
    (ratio = data / stored), 'on disk' everything including metadata.
    """
    with _opened(path) as store:
        details = _repr.describe(store)
        if as_json:
            _print_json(details.to_json())
        else:
            click.echo(_repr.render_text(details, store.schema.tree))


# ---- head -------------------------------------------------------------------------------------


class _Several(click.Option):
    """An option that takes every value up to the next option: ``--columns .a .b['k']``.

    The values taken are those that start like a keypath (``.`` or ``[``); the option may
    also be repeated.
    """

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            long, short = getattr(parser, "_long_opt", {}), getattr(parser, "_short_opt", {})
            option = long.get(name) or short.get(name)  # click's parser: repeat if it changed
            if option is not None:
                option.process = self._greedy(option.process)

    @staticmethod
    def _greedy(process: Any) -> Any:
        def take(value: Any, state: Any) -> None:
            values = [value]
            while state.rargs and state.rargs[0][:1] in (".", "["):
                values.append(state.rargs.pop(0))
            for v in values:
                process(v, state)

        return take


@main.command()
@click.argument("path")
@click.option(
    "-n",
    "--records",
    "count",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How many records to print.",
)
@click.option(
    "--start",
    type=int,
    default=0,
    show_default=True,
    help="The first record to print; negative counts from the end (-1: the last).",
)
@click.option(
    "-c",
    "--columns",
    "columns",
    cls=_Several,
    multiple=True,
    metavar="KEYPATH...",
    help="Print only these columns: keypaths as load(columns=) takes them; a node's "
    "keypath selects every column below it (.p[0]).",
)
@click.option("--full", is_flag=True, help="Print every value, each record as its classes.")
@_json_option
def head(
    path: str, count: int, start: int, columns: tuple[str, ...], full: bool, as_json: bool
) -> None:
    """Print records of a store: by default one line per leaf (keypath, dtype and shape, the
    first values), after the store's static fields.

    With --full, each record whole, as the classes the schema names (the classes are not
    imported: records print the same wherever the store is read). With --json: a JSON list
    with one record per line, every value, as plain objects and lists.
    """
    with _opened(path) as store:
        total = len(store)
        first = _first_record(start, total)
        stop = min(first + count, total)
        try:
            shown = _read_records(store, range(first, stop), list(columns) or None)
        except PyTreeStoreError as err:
            _fail(str(err))
        if as_json:
            lines = [json.dumps(_jsonable(record.plain)) for record in shown]
            click.echo("[\n" + ",\n".join(lines) + "\n]" if lines else "[]")
            return
        width = max(shutil.get_terminal_size((100, 24)).columns - 4, 40)
        statics = static_fields(store.schema.tree, store.schema.ragged)
        if statics:
            click.echo("static fields\n" + "".join(f"  {f.text}\n" for f in statics))
        label = _root_label(store.schema.tree)
        for i, one in zip(range(first, stop), shown):
            text = one.full(width=width) if full else "\n".join([label, *_summary(one, width)])
            click.echo(f"[{i}] {text}")
        if stop < total:
            click.echo(f"... {total - stop:,} more of {total:,} records")


def _first_record(start: int, total: int) -> int:
    """``--start`` as a record index; out of range is a usage error."""
    first = start + total if start < 0 else start
    if 0 <= first < total or start == 0:
        return first
    span = f"0 to {total - 1}, or -{total} to -1" if total else "0: the store is empty"
    raise click.BadParameter(
        f"{start} is out of range for a store of {total:,} records (use {span})",
        param_hint="'--start'",
    )


@dataclasses.dataclass(frozen=True)
class _Shown:
    """One record read for printing.

    Attributes:
        plain: the record as dicts, lists and leaves (``--json``).
        items: its ``(keypath, leaf)`` pairs (the summary lines).
        full: its every value as text, given ``width=`` (``--full``).
    """

    plain: Any
    items: list[tuple[str, Any]]
    full: Callable[..., str]


def _read_records(
    store: pytreestore.TreeStore, indices: range, columns: list[str] | None
) -> list[_Shown]:
    """Records ``indices`` read for printing; columns not selected are None.

    A fixed store's records are read together, as its columns' leaves; a ragged store's one
    at a time, exactly as ``store[i]`` gives them.
    """
    schema = store.schema
    if schema.ragged is not None:  # each record of its own structure
        shown = []
        for i in indices:
            record = store.load(i, as_numpy=True, columns=columns)
            plain = _plain(record)
            text = json.dumps(_jsonable(plain), separators=(", ", ": "))
            items = record_items(record, schema.ragged)
            shown.append(_Shown(plain, items, functools.partial(_clip, text)))
        return shown
    request = LoadRequest.build(schema, policy=False, columns=columns, as_numpy=True)
    leaves = load_leaves(store.read_context(), request, slice(indices.start, indices.stop))
    rows = [[None if leaf is None else leaf[i] for leaf in leaves] for i in range(len(indices))]
    return [
        _Shown(
            schema.unflatten(row),
            [(schema.columns[c].path, row[c]) for c in request.chosen],
            functools.partial(format_record, schema.tree, row),
        )
        for row in rows
    ]


def _summary(shown: _Shown, width: int) -> list[str]:
    return summary_lines(shown.items, width=width) or ["  (no leaves)"]


def _root_label(tree: dict[str, Any]) -> str:
    """What a record is: its class (``AllParams``), or ``dict``, ``list``..."""
    return tree["type"].rpartition(":")[2] if "type" in tree else tree["node"]


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _plain(value: Any) -> Any:
    """A record as dicts, lists and leaves: dataclass and NamedTuple nodes by field name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and fields is not None:
        return {k: _plain(v) for k, v in zip(fields, value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# ---- verify -----------------------------------------------------------------------------------


@main.command()
@click.argument("path")
@_progress_option
@_json_option
def verify(path: str, progress: bool | None, as_json: bool) -> None:
    """Check every column of a store against its commit record.

    Prints each problem found and exits with status 1 if there is any, 0 if none.
    A store whose metadata is too damaged to open counts as one problem.
    """
    try:
        store = open_any(path)
    except (CorruptStoreError, NotAStoreError) as err:
        _report_verify(path, {"records": None, "columns": None}, [str(err)], as_json)
    except PyTreeStoreError as err:
        _fail(str(err))
    with store:
        facts, problems = _run_verify(store, _show_progress(progress))
    _report_verify(path, facts, problems, as_json)


def _run_verify(store: pytreestore.TreeStore, progress: bool) -> tuple[dict[str, Any], list[Any]]:
    """Runs ``store.verify()``: what it checked, and the problems it found."""
    try:
        report = store.verify(progress=progress)
    except CorruptStoreError as err:
        return {"records": len(store), "columns": len(store.schema.columns)}, [str(err)]
    except PyTreeStoreError as err:  # storage unreachable, say: nothing can be concluded
        _fail(str(err))
    facts: dict[str, Any] = {
        "records": report.records,
        "columns": report.columns,
        "chunks": report.chunks,
    }
    if report.unchecksummed:
        facts["unchecksummed"] = list(report.unchecksummed)
    return facts, list(report.problems)


def _report_verify(
    path: str, facts: dict[str, Any], problems: list[Any], as_json: bool
) -> NoReturn:
    if as_json:
        report = [_problem_json(p) for p in problems]
        _print_json({"path": path, **facts, "ok": not problems, "problems": report})
    elif problems:
        click.echo(f"{path}: {len(problems)} problem(s)")
        for p in problems:
            click.echo(f"  - {p}")
    else:
        checked = f", {facts['chunks']:,} chunks" if "chunks" in facts else ""
        click.echo(
            f"{path}: OK ({facts['records']:,} records, {facts['columns']} columns{checked})"
        )
    if facts.get("unchecksummed") and not as_json:
        click.echo(
            f"  (no checksums in {', '.join(facts['unchecksummed'])}: flipped bits there go unseen)"
        )
    sys.exit(EXIT_PROBLEMS if problems else 0)


# ---- copy -------------------------------------------------------------------------------------


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def versions(path: str, as_json: bool) -> None:
    """List the versions a store keeps: number, records, time, operation, tags."""
    with _opened(path) as store:
        try:
            listed = store.versions()
        except PyTreeStoreError as err:
            _fail(str(err))
    if as_json:
        _print_json(
            [{**dataclasses.asdict(v), "time": v.time and v.time.isoformat()} for v in listed]
        )
        return
    for v in listed:
        when = v.time.strftime("%Y-%m-%d %H:%M:%S") if v.time else "-"
        gone = "" if v.readable else "  (gone: written over after a truncate)"
        tags = f"  [{', '.join(v.tags)}]" if v.tags else ""
        click.echo(f"{v.version:>6}  {v.records:>12,}  {when}  {v.operation or '-':<8}{tags}{gone}")


class _PackParam(click.ParamType):
    """``--pack keep|off|on|N``: ``pytreestore.copy``'s ``pack="keep"|False|True|N``."""

    name = "pack"

    def convert(self, value: Any, param: Any, ctx: Any) -> bool | int | str:
        if not isinstance(value, str):
            return value  # already converted
        word = value.strip().lower()
        if word in _PACK_WORDS:
            return _PACK_WORDS[word]
        if word.isdigit() and int(word) > 0:
            return int(word)
        self.fail(
            f"{value!r}: expected 'keep' (pack as the source is packed), 'off' (one array per "
            f"leaf), 'on' (pack leaves of at most {PACK_LEAF_BYTES} bytes per record) or a "
            "positive number of bytes per record (pack leaves of at most that many bytes), "
            "for example --pack 256",
            param,
            ctx,
        )


@main.command()
@click.argument("src")
@click.argument("dst")
@click.option(
    "--chunk-records",
    type=click.IntRange(min=1),
    default=None,
    help="Records per chunk of the copy  [default: the source's]",
)
@click.option(
    "--codec",
    type=click.Choice(_CODECS),
    default=KEEP,
    show_default=True,
    help="Compression of the copy; 'none' stores raw bytes, 'keep' the source's codec.",
)
@click.option(
    "--backend",
    default="tensorstore",
    show_default=True,
    help="Storage engine that writes the copy: tensorstore, zarr or ocdbt (an OCDBT "
    "database, which zarr-python cannot read; copy it back with --backend tensorstore).",
)
@click.option(
    "--pack",
    type=_PackParam(),
    metavar="[keep|off|on|N]",
    default=KEEP,
    show_default=True,
    help="Packing of small leaves into shared arrays: 'keep' the source's, 'off' (one array "
    f"per leaf, what plain zarr readers expect), 'on' (leaves of at most {PACK_LEAF_BYTES} "
    "bytes per record), or N (leaves of at most N bytes per record).",
)
@click.option("--overwrite", is_flag=True, help="Replace a store already at DST.")
@_progress_option
@_json_option
def copy(
    src: str,
    dst: str,
    chunk_records: int | None,
    codec: str,
    backend: str,
    pack: bool | int | str,
    overwrite: bool,
    progress: bool | None,
    as_json: bool,
) -> None:
    """Copy store SRC to a new store DST: rechunk, recompress, repack, or move it elsewhere.

    The copy has the same schema and records; only its chunking, codec, packing or place differ.
    """
    chosen = None if codec == "none" else codec
    try:
        records = pytreestore.copy(
            src,
            dst,
            chunk_records=chunk_records,
            codec=chosen,
            backend=backend,
            overwrite=overwrite,
            progress=_show_progress(progress),
            pack=pack,
        )
    except (PyTreeStoreError, ValueError) as err:
        _fail(str(err).replace("pass overwrite=True", "pass --overwrite"))
    if as_json:
        _print_json({"src": src, "dst": dst, "records": records})
    else:
        click.echo(f"copied {records:,} records from {src} to {dst}")


# ---- helpers ----------------------------------------------------------------------------------


@contextmanager
def _opened(path: str) -> Iterator[pytreestore.TreeStore]:
    """The store at ``path``, read-only and generic; a store that won't open is an error."""
    try:
        store = open_any(path)
    except PyTreeStoreError as err:
        _fail(str(err))
    with store:
        yield store


def _fail(message: str) -> NoReturn:
    click.echo(f"pytreestore: error: {message}", err=True)
    sys.exit(EXIT_ERROR)


def _show_progress(flag: bool | None) -> bool:
    return _progress.default_enabled() if flag is None else flag


def _print_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, allow_nan=True))


def _problem_json(problem: Any) -> Any:
    if dataclasses.is_dataclass(problem) and not isinstance(problem, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(problem).items()}
    return str(problem)


def _jsonable(value: Any) -> Any:
    """Plain JSON values for a tree of dicts, lists, tuples, None and numpy values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    array = np.asarray(value)
    if array.dtype.kind == "c":
        return _jsonable(np.stack([np.real(array), np.imag(array)], axis=-1))
    if array.dtype.kind not in "biu" and array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float32)  # float16, bfloat16, float8: exact in float32
    return array.tolist()


if __name__ == "__main__":  # pragma: no cover
    main()
