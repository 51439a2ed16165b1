"""The ``pytreestore`` commands: info, head, verify, versions and copy.

``pytreestore info`` and ``pytreestore head``: a store's column tree, and its first records.

Neither needs the store's classes: a fixed store is read as its generic view, a ragged one
with stand-ins for its classes (:mod:`pytreestore._open.standins`).

``pytreestore verify`` and ``pytreestore versions``: a store checked against its commit
record, and the versions it keeps. Neither needs the store's classes.

``pytreestore copy``: a store copied elsewhere, rechunked, recompressed, repacked or moved
to another backend.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import click

import pytreestore
from pytreestore._cli.common import (
    EXIT_PROBLEMS,
    Command,
    fail,
    json_option,
    jsonable,
    main,
    opened,
    print_json,
    problem_json,
    progress_option,
    show_progress,
)
from pytreestore._format.compression import CODECS, PACK_LEAF_BYTES
from pytreestore._inspect import repr as _repr
from pytreestore._inspect.printed import (
    format_record,
    record_items,
    static_fields,
    summary_lines,
)
from pytreestore._open.copy import KEEP
from pytreestore._open.standins import StandIn, fields_of, open_without_classes
from pytreestore._read.reader import load_leaves
from pytreestore._read.request import LoadRequest
from pytreestore.errors import CorruptStoreError, NotAStoreError, PyTreeStoreError


@main.command()
@click.argument("path")
@json_option
def info(path: str, as_json: bool) -> None:
    """Show a store's column tree: dtype, per-record shape, chunks, bytes and compression.

    The headline gives the record count, format version, chunking and codec, and the sizes:
    'data' is the records' uncompressed bytes, 'stored' the bytes of their chunks on disk
    (ratio = data / stored), 'on disk' everything including metadata.
    """
    with opened(path) as store:
        details = _repr.describe(store)
        if as_json:
            print_json(details.to_json())
        else:
            click.echo(_repr.render_text(details, store.schema.tree))


class _Head(Command):
    """``head``, whose ``--columns`` (``-c``) takes every keypath that follows it.

    ``--columns .a .b['k']`` is read as ``--columns .a --columns .b['k']``: after the option's
    value, each argument that starts like a keypath (``.`` or ``[``) is one more value. The
    option may also be repeated. The command line is rewritten before click parses it
    (:meth:`click.Command.parse_args`), so click's parser itself is used as it comes.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_columns(args))


def spread_columns(args: list[str]) -> list[str]:
    """``args`` with each keypath after a ``--columns`` value given its own ``--columns``.

    Example:
        >>> spread_columns(["s", "-c", ".a", ".b['k']", "-n", "1", "--columns=.c", "[0]"])
        ['s', '-c', '.a', '--columns', ".b['k']", '-n', '1', '--columns=.c', '--columns', '[0]']
    """
    out: list[str] = []
    taking = False  # after the option's value: a keypath is one more value
    i = 0
    while i < len(args):
        arg, i = args[i], i + 1
        if arg == "--":  # what follows are arguments, not options
            return [*out, *args[i - 1 :]]
        if taking and arg[:1] in (".", "["):
            out += ["--columns", arg]
            continue
        out.append(arg)
        taking = arg.startswith("--columns=") or (arg.startswith("-c") and arg != "-c")
        if arg in _COLUMNS and i < len(args):
            out.append(args[i])  # the option's value, whatever it is
            i, taking = i + 1, True
    return out


_COLUMNS = ("-c", "--columns")


@main.command(cls=_Head)
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
    multiple=True,
    metavar="KEYPATH...",
    help="Print only these columns: keypaths as load(columns=) takes them; a node's "
    "keypath selects every column below it (.p[0]).",
)
@click.option(
    "--full",
    is_flag=True,
    help="Print every value: each record as its classes print it (a ragged store's records "
    "as one line of JSON each).",
)
@json_option
def head(
    path: str, count: int, start: int, columns: tuple[str, ...], full: bool, as_json: bool
) -> None:
    """Print records of a store: by default one line per leaf (keypath, dtype and shape, the
    first values), after the store's static fields.

    With --full, each record whole, every value, floats as the shortest text that reads back
    the same: as the classes the schema names (the classes are not imported: records print
    the same wherever the store is read); a ragged store's records as one line of JSON each. With --json: a JSON list
    with one record per line, every value, as plain objects and lists.
    """
    with opened(path) as store:
        total = len(store)
        first = _first_record(start, total)
        stop = min(first + count, total)
        shown = _read_records(store, range(first, stop), list(columns) or None)
        if as_json:
            lines = [json.dumps(jsonable(record.plain)) for record in shown]
            click.echo("[\n" + ",\n".join(lines) + "\n]" if lines else "[]")
            return
        width = max(shutil.get_terminal_size((100, 24)).columns - 4, 40)
        statics = static_fields(store.schema.tree, store.schema.tables)
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
        full: its every value as text, given ``width=`` (``--full``): as its classes print
            it, broken over lines wider than ``width``; a ragged store's, one line of JSON.
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
            text = json.dumps(jsonable(plain), separators=(", ", ": "))
            items = record_items(record, schema.tables)
            shown.append(_Shown(plain, items, functools.partial(_whole, text)))
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


def _whole(text: str, width: int) -> str:
    """A ragged record's ``--full`` text: one line of JSON, never cut (``width`` is unused)."""
    return text


def _plain(value: Any) -> Any:
    """A record as dicts, lists and leaves: dataclass and NamedTuple nodes by field name."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, StandIn):  # a ragged store read without its classes
        return {name: _plain(v) for name, v in fields_of(value)}
    fields = getattr(value, "_fields", None)
    if isinstance(value, tuple) and fields is not None:
        return {k: _plain(v) for k, v in zip(fields, value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@main.command()
@click.argument("path")
@progress_option
@json_option
def verify(path: str, progress: bool | None, as_json: bool) -> None:
    """Check every column of a store against its commit record.

    Prints each problem found and exits with status 1 if there is any, 0 if none.
    A store whose metadata is too damaged to open counts as one problem.
    """
    try:
        store = open_without_classes(path)
    except (CorruptStoreError, NotAStoreError) as err:
        _report_verify(path, {"records": None, "columns": None}, [str(err)], as_json)
    with store:
        facts, problems = _run_verify(store, show_progress(progress))
    _report_verify(path, facts, problems, as_json)


def _run_verify(store: pytreestore.TreeStore, progress: bool) -> tuple[dict[str, Any], list[Any]]:
    """Runs ``store.verify()``: what it checked, and the problems it found."""
    try:
        report = store.verify(progress=progress)
    except CorruptStoreError as err:
        return {"records": len(store), "columns": len(store.schema.columns)}, [str(err)]
    # any other error (storage unreachable, say: nothing can be concluded) fails the command
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
        report = [problem_json(p) for p in problems]
        print_json({"path": path, **facts, "ok": not problems, "problems": report})
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


@main.command()
@click.argument("path")
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def versions(path: str, as_json: bool) -> None:
    """List the versions a store keeps: number, records, time, operation, tags."""
    with opened(path) as store:
        listed = store.versions()
    if as_json:
        print_json(
            [{**dataclasses.asdict(v), "time": v.time and v.time.isoformat()} for v in listed]
        )
        return
    for v in listed:
        when = v.time.strftime("%Y-%m-%d %H:%M:%S") if v.time else "-"
        gone = "" if v.readable else "  (gone: written over after a truncate)"
        tags = f"  [{', '.join(v.tags)}]" if v.tags else ""
        click.echo(f"{v.version:>6}  {v.records:>12,}  {when}  {v.operation or '-':<8}{tags}{gone}")


#: ``--codec``: a codec's name; ``none`` for no codec (None), ``keep`` for the source's
_NONE = "none"


_CODECS = (*(name for name in CODECS if name is not None), _NONE, KEEP)


_PACK_WORDS: dict[str, bool | str] = {"keep": KEEP, "off": False, "on": True}  # --pack N too


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
@progress_option
@json_option
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
    chosen = None if codec == _NONE else codec
    try:
        records = pytreestore.copy(
            src,
            dst,
            chunk_records=chunk_records,
            codec=chosen,
            backend=backend,
            overwrite=overwrite,
            progress=show_progress(progress),
            pack=pack,
        )
    except (PyTreeStoreError, ValueError) as err:
        fail(str(err).replace("pass overwrite=True", "pass --overwrite"))
    if as_json:
        print_json({"src": src, "dst": dst, "records": records})
    else:
        click.echo(f"copied {records:,} records from {src} to {dst}")
