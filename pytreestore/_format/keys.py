"""Names on disk, tree paths and storage keys.

Every name pytreestore gives a thing on disk, defined once.

A store is a zarr v3 hierarchy: the root group's ``zarr.json`` holds the schema, each column is
an array (its own ``zarr.json`` and chunks ``<column>/c/<i>/<j>...``), and pytreestore keeps its
own files under ``.pytreestore/``.

Example:
    >>> from pytreestore._format.keys import COMMIT_KEY, chunk_key
    >>> COMMIT_KEY, chunk_key("p/x", (3, 0))
    ('.pytreestore/commit.json', 'p/x/c/3/0')

Tree paths and storage keys.

A column lives at a storage key derived from its leaf's tree path: one key component per path
entry, joined with ``/``. ``.p[0].x`` becomes ``p/0/x`` and ``['a/b']`` becomes ``a-2Fb``.

Escaping keeps every component inside zarr v3's portable node-name alphabet ``[A-Za-z0-9_.-]``
(zarrita.js and other URL-based readers percent-decode keys, so ``%`` is not used), with ``-``
as the escape character: any character outside ``[A-Za-z0-9_.]`` (``-`` itself included) is
written as ``-XX`` per UTF-8 byte, upper-case hex. A component that would collide with zarr's
own names is escaped too: a leading ``.`` (hidden files, ``.`` and ``..``; pytreestore keeps
its own files under ``.pytreestore/``), a leading ``__`` (reserved by zarr v3), ``zarr.json``,
and a trailing ``.__lock`` (reserved by TensorStore's file kvstore). The empty string is written
``-`` (a lone dash). The mapping is injective and :func:`unescape` inverts it.

Stores written before this scheme used ``%XX`` escapes (and ``%`` for the empty string). The
mapping is stored per column in the schema and readers use the stored key, so those stores keep
opening; :func:`decode_name` reads a component of either scheme.

Example:
    >>> escape("a/b"), escape("a-b"), escape("énergie"), escape(".hidden"), escape("")
    ('a-2Fb', 'a-2Db', '-C3-A9nergie', '-2Ehidden', '-')
    >>> unescape("a-2Fb"), unescape("-")
    ('a/b', '')
    >>> decode_name("a%2Fb"), decode_name("a-2Fb")
    ('a/b', 'a/b')
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import unquote

from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey, keystr

from pytreestore._format import values as _values

#: the metadata document of a zarr v3 node (the root group's holds the schema)
ROOT_KEY = "zarr.json"


#: the folder of pytreestore's own files below the store root
META_DIR = ".pytreestore"


#: the commit record: how many records are durable, and how many commits came before
COMMIT_KEY = f"{META_DIR}/commit.json"


#: the writer lock (a ``flock``-ed file locally, a conditionally written object elsewhere)
LOCK_KEY = f"{META_DIR}/lock"


#: format 3: the commit claim of writers sharing a store through an OCDBT coordinator, held
#: for one commit each (:mod:`pytreestore._log.locks`)
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


#: the characters a component keeps as they are; every other one is escaped
_SAFE = frozenset(string.ascii_letters + string.digits + "_.")


#: the escape character: ``-XX`` is one UTF-8 byte, and ``-`` alone is the empty string
ESCAPE = "-"


#: the key component of the empty string, and the key of a store whose record is one leaf
EMPTY = ESCAPE


_LOCK_SUFFIX = ".__lock"  # TensorStore's file kvstore reserves this suffix


_BYTES = re.compile(r"((?:-[0-9A-F]{2})+)")


_ESCAPED = re.compile(r"(?:[A-Za-z0-9_.]|-[0-9A-F]{2})+")


KeyEntry = GetAttrKey | DictKey | SequenceKey | FlattenedIndexKey | str | int


def escape(name: str) -> str:
    """Turns one path component into a storage key component."""
    if name == "":
        return EMPTY
    out = "".join(c if c in _SAFE else _hex(c) for c in name)
    if out.startswith("."):
        out = "-2E" + out[1:]
    elif out.startswith("__"):
        out = "-5F" + out[1:]
    elif out == ROOT_KEY:
        out = "zarr-2Ejson"
    if out.endswith(_LOCK_SUFFIX):
        out = out[: -len(_LOCK_SUFFIX)] + "-2E__lock"
    return out


def unescape(component: str) -> str:
    """Inverts :func:`escape`; raises ValueError for a component it cannot have written."""
    if component == EMPTY:
        return ""
    try:
        name = _decode_bytes(component, "strict") if _ESCAPED.fullmatch(component) else None
    except UnicodeDecodeError:
        name = None
    if name is None or escape(name) != component:
        raise ValueError(f"{component!r} is not a key component escape() writes")
    return name


def decode_name(component: str) -> str:
    """The name a stored key component stands for, of either scheme, for display (such as
    zarr ``dimension_names``): a component holding ``%`` is an old ``%XX`` one (``%`` alone:
    the empty string). Never raises: what decodes as neither is returned as it is."""
    if "%" in component:
        return "" if component == "%" else unquote(component, errors="replace")
    if component == EMPTY:
        return ""
    return _decode_bytes(component, errors="replace")


def _decode_bytes(component: str, errors: str) -> str:
    pieces = _BYTES.split(component)  # text, escaped bytes, text, ...
    raw = b"".join(
        bytes.fromhex(p.replace(ESCAPE, "")) if i % 2 else p.encode("utf-8")
        for i, p in enumerate(pieces)
    )
    return raw.decode("utf-8", errors)


def _hex(char: str) -> str:
    return "".join(f"-{b:02X}" for b in char.encode("utf-8"))


def entry_name(entry: Any) -> str:
    """The plain name of one keypath entry: a field name, a dict key, an index, or the entry.

    Besides JAX's four key classes, ``register_pytree_with_keys`` lets a node use plain str and
    int entries (JAX's own tests do); those name themselves.
    """
    if isinstance(entry, GetAttrKey):
        return entry.name
    if isinstance(entry, DictKey):
        return str(entry.key)
    if isinstance(entry, SequenceKey):
        return str(entry.idx)
    if isinstance(entry, FlattenedIndexKey):
        return str(entry.key)
    if type(entry) in (str, int):
        return str(entry)
    raise TypeError(_unsupported(entry))


def _unsupported(entry: Any) -> str:
    return (
        f"keypath entry {entry!r} of type {type(entry).__name__} cannot be stored; a custom "
        "node's keys must be GetAttrKey, DictKey (with a JSON-able key), SequenceKey, "
        "FlattenedIndexKey, str or int"
    )


def path_to_key(path: Sequence[Any]) -> str:
    """Storage key of the column at ``path``; the root leaf's key is ``-``.

    Example:
        >>> from jax.tree_util import GetAttrKey, SequenceKey
        >>> path_to_key((GetAttrKey("p"), SequenceKey(0), GetAttrKey("x")))
        'p/0/x'
    """
    if not path:
        return EMPTY
    return "/".join(escape(entry_name(e)) for e in path)


def path_str(path: Sequence[Any]) -> str:
    """The one way pytreestore prints a tree path: :func:`jax.tree_util.keystr`."""
    return keystr(tuple(path))


def entry_to_json(entry: Any) -> dict[str, Any]:
    """Encodes a keypath entry as a one-key JSON object; raises TypeError for other entries.

    Example:
        >>> entry_to_json("x"), entry_to_json(DictKey((1, "a")))
        ({'str': 'x'}, {'key': {'tuple': [1, 'a']}})
    """
    if isinstance(entry, GetAttrKey):
        return {"attr": entry.name}
    if isinstance(entry, DictKey):
        try:
            return {"key": _values.encode(entry.key)}
        except TypeError as err:
            raise TypeError(_unsupported(entry)) from err
    if isinstance(entry, SequenceKey):
        return {"index": entry.idx}
    if isinstance(entry, FlattenedIndexKey):
        return {"flat": entry.key}
    if type(entry) is str:
        return {"str": entry}
    if type(entry) is int:
        return {"int": entry}
    raise TypeError(_unsupported(entry))


_FROM_JSON: dict[str, Any] = {
    "attr": GetAttrKey,
    "key": lambda v: DictKey(_values.decode(v)),
    "index": SequenceKey,
    "flat": FlattenedIndexKey,
    "str": str,
    "int": int,
}


def entry_from_json(obj: dict[str, Any]) -> KeyEntry:
    """Inverts :func:`entry_to_json`."""
    ((kind, value),) = obj.items()
    return _FROM_JSON[kind](value)


def is_under(path: str, node: str) -> bool:
    """Whether the tree path ``path`` is ``node`` or lies below it (``""`` is the root).

    This is the one rule of column selectors (``columns=``) and of sharding trees.

    Example:
        >>> is_under(".p[0].x", ".p[0]"), is_under(".p[10]", ".p[1]"), is_under(".a", "")
        (True, False, True)
    """
    return path == node or (path.startswith(node) and (not node or path[len(node)] in ".["))
