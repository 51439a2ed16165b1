"""In-memory array-of-structs <-> struct-of-arrays, with the store's validation and dtypes.

Example:
    >>> import pytreestore
    >>> batch = pytreestore.stack([{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}])
    >>> batch["a"]
    Array([1, 3], dtype=int32, weak_type=True)
    >>> pytreestore.unstack(batch)[1]["b"]
    Array(4., dtype=float32, weak_type=True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import jax
import numpy as np
from jax.tree_util import keystr, tree_flatten

from pytreestore import _arguments
from pytreestore._format import dtypes as _dtypes
from pytreestore._format.dtypes import ragged_weak, weaken
from pytreestore._format.schema import TreeSchema
from pytreestore._tree.convert import RowFiller, casters
from pytreestore._tree.device import VALID, refuse_unreadable
from pytreestore._tree.layout import (
    Walker,
    build_layout,
    check_known,
    check_used,
    record_problems,
    weak_paths,
    with_hints,
)
from pytreestore._tree.layout_nodes import Declarations
from pytreestore._tree.pad import (
    Layout,
    Padder,
    check_pad_to,
    empty_axis,
    is_array,
    leaf_refs,
    padded_length,
    recall,
    remember,
    same_leaves,
    stack_trees,
    unpad,
)
from pytreestore._tree.pad_columns import Departs, Space, segment, walk
from pytreestore._tree.pad_columns import pad as scatter_pad
from pytreestore._tree.unpad import split
from pytreestore.errors import ArgumentError, RaggedDeclarationError, SchemaMismatchError


def stack(
    records: Iterable[Any],
    *,
    like: Any = None,
    as_numpy: bool = False,
    ragged: bool | Sequence[str] | None = None,
    optional: Sequence[str] | None = None,
    pad_to: int | str | Sequence[int] | None = None,
    trim: bool = False,
    truncate: bool | None = None,
) -> Any:
    """Stacks records into one batched record, as a store would hold them.

    Without ``ragged=`` and ``optional=`` every record has the structure and leaf shapes of
    ``like`` and the batch is returned. With either, records may differ where declared and
    ``(batch, mask)`` is returned (see docs/ragged.md): each ragged list becomes one stacked
    element (struct of arrays, leaves ``[records, L, ...]``), a ragged leading axis is padded
    to ``L``, a missing optional subtree is filled with zeros; ``mask`` has the structure of
    ``batch``, one bool leaf over the padded axes of each leaf, True where a value is real.
    The records are walked once into one column per leaf and each leaf padded with one numpy
    assignment; when a record departs anywhere, the records are checked one by one so that
    the error names the record, the keypath and the declaration that would accept it.

    Args:
        records: records of one structure (a list, or any iterable).
        like: the example record that fixes the schema; by default the first record.
        as_numpy: return numpy leaves instead of ``jax.Array``.
        ragged: True (every list, and the leading axis of every array leaf, may vary in
            length) or the keypaths that may (``".p"``, ``".regions[*].events"``; a node that
            is not a list: its array leaves share one ragged leading axis).
        optional: keypaths of subtrees that may be None.
        pad_to: None (the longest), an int, ``"pow2"`` or increasing bucket sizes (the
            smallest that holds the longest): the length every ragged axis is padded to.
        trim: cut lists and axes longer than ``pad_to`` instead of raising.
        truncate: the old name of ``trim`` (an alias).

    Raises:
        SchemaMismatchError: a record's structure, a shape or a dtype differs from ``like``
            where nothing was declared; every differing keypath is listed, each with the
            declaration that would accept it.
        RaggedLengthError: a length above an explicit ``pad_to`` (without ``trim``).
        RaggedDeclarationError: a bad ``ragged=``, ``optional=`` or ``pad_to=``.
        ArgumentError: no records and no ``like`` (ArgumentTypeError: ``records`` is not
            iterable).
        DeviceFetchError: a record's ``jax.Array`` could not be fetched from its device (the
            computation that made it failed; DeletedArrayError: it is deleted).
    """
    records = list(_arguments.iterable(records, "stack()", "records"))
    trim = _arguments.trimmed(trim, truncate)
    if like is None and not records:
        raise ArgumentError("stack() needs at least one record, or like= to fix the schema")
    if ragged is None and optional is None and (pad_to is not None or trim):
        raise RaggedDeclarationError(
            "pad_to= and trim= apply to records stacked with ragged= or optional="
        )
    try:
        return _stacked(records, like, as_numpy, ragged, optional, pad_to, trim)
    except Exception as err:  # JAX's, reading a jax.Array: deleted, or its computation failed
        for i, record in enumerate(records):
            refuse_unreadable(err, record, f"stack() refused record {i}: ", fix=VALID)
        raise


def _stacked(
    records: list[Any],
    like: Any,
    as_numpy: bool,
    ragged: bool | Sequence[str] | None,
    optional: Sequence[str] | None,
    pad_to: int | str | Sequence[int] | None,
    trim: bool,
) -> Any:
    """:func:`stack` of the arguments it checked."""
    if ragged is None and optional is None:
        return _stack_fixed(records, records[0] if like is None else like, as_numpy)
    pad_to = check_pad_to(pad_to)
    decl = Declarations.parse(ragged, optional)
    gathered = _stack_gathered(records, like, decl, pad_to, trim)
    if gathered is not None:
        return _finish(*gathered, as_numpy)
    decl = Declarations.parse(ragged, optional)  # anew: the checked path finds its own uses
    padder = Padder(build_layout(records, like, decl), pad_to, trim)
    return _stack_padded(padder, records, as_numpy)


def _stack_fixed(records: list[Any], like: Any, as_numpy: bool) -> Any:
    schema = TreeSchema.from_example(like, chunk_records=1, recorded=False)
    buffers = [np.empty((len(records), *c.shape), c.dtype) for c in schema.columns]
    filler = RowFiller(casters(schema.columns), buffers)
    for i, record in enumerate(records):
        leaves, treedef = tree_flatten(record)
        if not schema.holds(treedef):
            message = schema.mismatch_message(record, what=f"record {i}")
            raise SchemaMismatchError(_with_hints(message, like, record))
        try:
            filler.fill(schema.column_leaves(leaves), i)
        except SchemaMismatchError as err:
            message = f"stack() refused record {i}: {err}"
            raise SchemaMismatchError(_with_hints(message, like, record)) from err
    if not as_numpy:
        ready = [jax_ready(b, c.path) for b, c in zip(buffers, schema.columns)]
        buffers = weaken(jax.device_put(ready), schema.weak)  # as jnp.stack keeps weak types
    return schema.unflatten(buffers)


def _with_hints(message: str, like: Any, record: Any) -> str:
    """``message`` with the declaration that would accept each difference, and every
    differing keypath it does not list yet."""
    return with_hints(message, record_problems(like, record))


def _stack_gathered(
    records: list[Any], like: Any, decl: Declarations, pad_to: Any, trim: bool
) -> tuple[Any, Any, Layout] | None:
    """``(batch, mask, layout)`` of ``records`` walked once into columns and padded column by
    column; None when a record departs from the layout anywhere (or the layout has a node
    this path leaves alone): the checked per-record path then says what and where."""
    spec = _known_layout(records, like, decl) if records else None
    if spec is None:
        return None
    try:
        top = segment(spec)
        walk(top, records)
        batch, mask = scatter_pad(top, Space.records(len(records)), _limit(pad_to), trim)
    except Departs:
        return None
    check_used(decl, spec)  # as the checked path would, finding no record that departs
    return batch, mask, Layout(spec, (), None, records=len(records), gathered=top)


def _limit(pad_to: Any) -> Any:
    return lambda longest: padded_length(pad_to, longest)


def _known_layout(records: list[Any], like: Any, decl: Declarations) -> Any:
    """The layout of ``like`` (or the first record), merged with the records in order (as
    :func:`build_layout` does) until every ragged list's element and optional subtree is
    known; None when a record departs from it before that, or none shows one."""
    walker = Walker(decl)
    spec = walker.build(like if like is not None else records[0], (), None)
    for i, record in enumerate(records):
        if _known(spec):
            return spec
        walker.record = i
        if i > 0 or like is not None:
            walker.merge(spec, record, ())
        if walker.problems:
            return None
    return spec if _known(spec) else None


def _known(spec: Any) -> bool:
    try:
        check_known(spec)
    except RaggedDeclarationError:
        return False
    return True


def _stack_padded(padder: Padder, records: list[Any], as_numpy: bool) -> tuple[Any, Any]:
    parts = [padder.pad(padder.spec, r, i) for i, r in enumerate(records)]
    if parts:
        batch = stack_trees([p[0] for p in parts])
        mask = stack_trees([p[1] for p in parts])
    else:
        batch, mask = (empty_axis(t) for t in padder.zeros(padder.spec))
    skeletons = tuple(p[2] for p in parts)
    layout = Layout(padder.spec, skeletons, None, records=len(skeletons))
    return _finish(batch, mask, layout, as_numpy)


def _finish(batch: Any, mask: Any, layout: Layout, as_numpy: bool) -> tuple[Any, Any]:
    """``(batch, mask)`` on the device unless ``as_numpy``, with the mask tied to ``layout``."""
    if not jax.tree.leaves(mask):
        raise SchemaMismatchError(
            "stack() found no leaf in the records (only None and empty nodes): the mask "
            "carries the list lengths and present subtrees on its leaves, so there is "
            "nothing to carry them"
        )
    if not as_numpy:
        batch, mask = (jax.tree.map_with_path(_to_device, t) for t in (batch, mask))
        batch = _weakened(batch, layout.spec)
    leaves, batch_treedef = tree_flatten(batch)
    shapes = tuple(np.shape(x) if is_array(x) else None for x in leaves)
    refs = leaf_refs([x if is_array(x) else None for x in leaves])
    layout = dataclasses.replace(
        layout,
        mask_treedef=jax.tree.structure(mask),
        batch_treedef=batch_treedef,
        batch_shapes=shapes,
        batch_leaves=refs,
    )
    remember(mask, layout)
    return batch, mask


def _weakened(batch: Any, spec: Any) -> Any:
    """``batch`` (padded, on the device) with the leaves of weakly typed leaves made weak."""
    weak, lists = weak_paths(spec)
    if not weak:
        return batch
    pairs, treedef = jax.tree_util.tree_flatten_with_path(batch)
    flags = ragged_weak([p for p, _ in pairs], weak, lists, exact=False)
    return treedef.unflatten(weaken([x for _, x in pairs], flags))


def _to_device(path: Any, leaf: Any) -> Any:
    return jax.device_put(jax_ready(leaf, keystr(path))) if is_array(leaf) else leaf


def jax_ready(array: Any, path: str) -> Any:
    """``array`` in the dtype JAX gives it as configured (64-bit ones in 32 bits while x64
    is off), refused rather than wrapped or overflowed when its values do not fit.

    Raises:
        SchemaMismatchError: a value outside the 32-bit dtype.
    """
    if isinstance(array, jax.Array) or _dtypes.jax_holds(np.dtype(array.dtype)):
        return array
    array = np.asarray(array)
    target = np.dtype(jax.dtypes.canonicalize_dtype(array.dtype))
    with np.errstate(over="ignore", invalid="ignore"):
        out = array.astype(target)
    wrapped = target.kind in "iu" and not _dtypes.fits(array, target)
    if wrapped or (target.kind in "fc" and not np.array_equal(np.isinf(out), np.isinf(array))):
        raise SchemaMismatchError(
            f"stack() got {array.dtype} values at {path or 'the root'} outside {target}, the "
            "dtype JAX holds them in while x64 is disabled; pass as_numpy=True for the exact "
            "values, or enable x64 (jax.config.update('jax_enable_x64', True))"
        )
    return out


def unstack(batch: Any, mask: Any = None) -> list[Any]:
    """Splits a batched record into its records (the inverse of :func:`stack`).

    Leaves keep their kind: ``jax.Array`` leaves give ``jax.Array`` leaves, numpy gives numpy.
    A leaf that is not an array (a function: a constant leaf) is the same in every record.
    With the ``mask`` that ``stack(..., ragged=/optional=)`` returned, each record comes back
    as it was stacked: lists of their own lengths, None where it was None, arrays cut to
    their real leading length. A numpy batch splits at the speed of a numpy slicing loop;
    ``jax.Array`` leaves are split on the host and put back with one ``jax.device_put``,
    which still makes one array per value of each record (``as_numpy=True`` is faster).

    Raises:
        SchemaMismatchError: the leaves disagree on the leading (record) length, the batch
            has no array leaf to count its records by, or ``mask`` is not one that ``stack``
            returned.
    """
    if mask is not None:
        layout = recall(mask)
        _check_batch(batch, layout)
        if layout.gathered is not None:
            return split(layout.gathered, Space.records(layout.records), batch)
        rows = _rows(batch, layout.records)
        return [unpad(layout.spec, s, row) for s, row in zip(layout.skeletons, rows)]
    leaves, treedef = tree_flatten(batch)
    arrays = [leaf for leaf in leaves if not is_constant(leaf)]
    lengths = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in arrays}
    if None in lengths or len(lengths) > 1:
        raise SchemaMismatchError(
            f"unstack() needs leaves with one common leading record axis; got lengths {sorted(lengths, key=str)}"
        )
    if not arrays:
        raise SchemaMismatchError(
            "unstack() counts the records by the leading axis of the batch's array leaves, "
            f"and {type(batch).__name__} {batch!r:.60} has none (only constants, or no leaf): "
            "pass a batch that stack() or store.load() returned"
        )
    columns = [split_leaves(leaf) for leaf in leaves]
    return [treedef.unflatten(row) for row in zip(*columns)]


def _check_batch(batch: Any, layout: Layout) -> None:
    """Refuses a ``batch`` other than the one ``stack`` returned with the mask of ``layout``
    (another structure, other leaf shapes, or other array objects)."""
    leaves, treedef = tree_flatten(batch)
    shapes = tuple(np.shape(x) if is_array(x) else None for x in leaves)
    n = layout.records
    if treedef != layout.batch_treedef or shapes != layout.batch_shapes:
        counts = sorted({s[0] for s in shapes if s})
        detail = f" (records: {counts}, the mask's: {n})" if counts and counts != [n] else ""
        raise SchemaMismatchError(
            "unstack(batch, mask) got a batch whose structure or leaf shapes differ from the "
            f"batch that stack() returned with this mask{detail}: give each batch its own mask"
        )
    if not same_leaves(layout.batch_leaves, [x if is_array(x) else None for x in leaves]):
        raise SchemaMismatchError(
            "unstack(batch, mask) takes the batch that stack() returned with this mask, "
            "unchanged: another batch, or new values, of the same shapes cannot be told from "
            "it, and its padding would read as values. Unstack the original batch, or stack "
            "the new records again"
        )


def _rows(batch: Any, n: int) -> list[Any]:
    """The ``n`` records of a padded ``batch``, split leaf by leaf."""
    leaves, treedef = tree_flatten(batch)
    columns = [list(split_leaves(x)) if is_array(x) else [x] * n for x in leaves]
    return [treedef.unflatten([c[i] for c in columns]) for i in range(n)]


def batch_length(leaves: Sequence[Any], paths: Sequence[str]) -> int:
    """The common leading (record) length of a batch's leaves.

    Raises:
        SchemaMismatchError: a leaf has no leading axis, or the leaves disagree on its length.
    """
    lengths = []
    for leaf, path in zip(leaves, paths):
        shape = np.shape(leaf)
        if not shape:
            raise SchemaMismatchError(
                f"batch leaf at {path or 'the root'} has no leading record axis (shape ()); "
                "extend_batch takes leaves shaped (records, *leaf_shape); use append for one record"
            )
        lengths.append(shape[0])
    if len(set(lengths)) > 1:
        detail = ", ".join(f"{p or 'the root'}: {n}" for p, n in zip(paths, lengths))
        raise SchemaMismatchError(
            f"batch leaves disagree on the number of records ({detail}); every leaf of a batch "
            "needs the same leading length"
        )
    return lengths[0] if lengths else 0


def split_leaves(leaf: Any) -> list[Any]:
    """One leaf with a leading axis as a list of per-record leaves (None, and a constant leaf
    such as a function, stay as they are in every record)."""
    if leaf is None or is_constant(leaf):
        return _Repeat(leaf)
    if isinstance(leaf, jax.Array):
        return list(leaf)
    array = np.asarray(leaf)
    return [array[i, ...] for i in range(array.shape[0])]


_ARRAYS = (jax.Array, np.ndarray, np.generic, bool, int, float, complex)


def is_constant(leaf: Any) -> bool:
    """Whether a leaf is a constant (a function, ...): neither an array nor a scalar."""
    return leaf is not None and not isinstance(leaf, _ARRAYS)


class _Repeat(list):
    """An endless run of one value (None for unselected columns, or a constant leaf), so
    ``zip`` stops at the real columns."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value

    def __iter__(self):  # type: ignore[override]
        while True:
            yield self.value
