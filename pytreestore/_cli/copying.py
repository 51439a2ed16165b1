"""``pytreestore copy``: a store copied elsewhere, rechunked, recompressed, repacked or moved
to another backend."""

from __future__ import annotations

from typing import Any

import click

import pytreestore
from pytreestore._cli.common import (
    fail,
    json_option,
    main,
    print_json,
    progress_option,
    show_progress,
)
from pytreestore._format.compression import CODECS
from pytreestore._format.packs import PACK_LEAF_BYTES
from pytreestore._open.copy import KEEP
from pytreestore.errors import PyTreeStoreError

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
