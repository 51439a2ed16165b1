"""Every name pytreestore gives a thing on disk, defined once.

A store is a zarr v3 hierarchy: the root group's ``zarr.json`` holds the schema, each column is
an array (its own ``zarr.json`` and chunks ``<column>/c/<i>/<j>...``), and pytreestore keeps its
own files under ``.pytreestore/``.

Example:
    >>> from pytreestore._format.names import COMMIT_KEY, chunk_key
    >>> COMMIT_KEY, chunk_key("p/x", (3, 0))
    ('.pytreestore/commit.json', 'p/x/c/3/0')
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: the metadata document of a zarr v3 node (the root group's holds the schema)
ROOT_KEY = "zarr.json"
#: the folder of pytreestore's own files below the store root
META_DIR = ".pytreestore"
#: the commit record: how many records are durable, and how many commits came before
COMMIT_KEY = f"{META_DIR}/commit.json"
#: the writer lock (a ``flock``-ed file locally, a conditionally written object elsewhere)
LOCK_KEY = f"{META_DIR}/lock"
#: format 3: the commit claim of writers sharing a store through an OCDBT coordinator, held
#: for one commit each (:mod:`pytreestore._commit.claim`)
CLAIM_KEY = f"{META_DIR}/claim"
#: present while a store is being created or copied into; overwrite=True replaces such a store
INCOMPLETE_KEY = f"{META_DIR}/incomplete"
#: format 3: every commit's record, kept as ``<generation, 20 digits>.json`` (the versions)
VERSIONS_DIR = f"{META_DIR}/versions"
#: format 3: named versions, one ``<name>.json`` each
TAGS_DIR = f"{META_DIR}/tags"
#: format 3: every schema a version was committed with, as ``<digest hex>.json``
SCHEMAS_DIR = f"{META_DIR}/schemas"
#: issue 17: uncommitted fragments, one folder ``<fragment id>/`` each (readers never look here)
FRAGMENTS_DIR = f"{META_DIR}/fragments"
#: issue 17: a local commit of fragments under way: the chunk-row folders it moves from the
#: fragments into the store, undone after a crash before its commit record
PLACING_KEY = f"{META_DIR}/placing.json"
#: the token of a missing key in conditional writes (TensorStore's generation of one): pass it
#: to ``write_bytes_if`` to create only
NO_VALUE = b"\x02"
#: a chunk key, split into its column key and its chunk index
CHUNK_KEY_PATTERN = re.compile(r"^(.*)/c/(\d+(?:/\d+)*)$")


def chunk_prefix(column: str) -> str:
    """The prefix every chunk key of ``column`` (a storage key) starts with."""
    return f"{column}/c/"


def chunk_key(column: str, index: Iterable[int]) -> str:
    """The storage key of chunk ``index`` (record axis first) of ``column``."""
    return chunk_prefix(column) + "/".join(map(str, index))


def version_key(version: int) -> str:
    """The storage key of version ``version``'s record (zero-padded, so keys sort by number)."""
    return f"{VERSIONS_DIR}/{version:020d}.json"


def tag_key(name: str) -> str:
    """The storage key of the tag ``name``."""
    return f"{TAGS_DIR}/{name}.json"


def schema_key(schema_id: str) -> str:
    """The storage key of the schema whose digest is ``schema_id`` (``blake2b-160:<hex>``)."""
    return f"{SCHEMAS_DIR}/{schema_id.rpartition(':')[2]}.json"


def array_json(column: str) -> str:
    """The storage key of the metadata document of ``column``'s array."""
    return f"{column}/{ROOT_KEY}"


def fragment_folder(fragment: str) -> str:
    """The folder (a key prefix, no trailing ``/``) of the fragment whose id is ``fragment``."""
    return f"{FRAGMENTS_DIR}/{fragment}"
