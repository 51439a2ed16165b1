"""The row fill of one schema, generated as straight-line Python: the hot path of ``append``.

A loop over a record's leaves pays, per leaf, the loop, a tuple of the column's facts to
unpack and the checks; the floor of an append (a flatten and one numpy assignment per leaf)
pays only the assignment. :func:`compile_fill` writes, once per column layout, a function with
one line per column: the leaf's type tested against the types the column takes as they are
(its Python scalar types and numpy scalar type; or an array of its dtype and shape), then
assigned. Any other leaf goes to ``slow(column, leaf, row)`` (the casting rule, a device
array, an error). The code is built from column numbers only, never from names found in a
store, as :mod:`dataclasses` builds its methods.

Columns past :data:`MAX_COLUMNS` get no generated code (its cost would grow with the width);
the caller loops instead.

Example:
    >>> import numpy as np
    >>> buf = np.zeros(2, np.int32)
    >>> make = compile_fill([(frozenset({int}), np.dtype("int32"), ())], "demo")
    >>> fill = make([buf], lambda column, leaf, row: None, None)
    >>> fill([7], 1); buf
    array([0, 7], dtype=int32)

Checking leaf values against their columns and copying them into row buffers.

The fast path of an append is one flatten, one treedef comparison and, per leaf, one type test
and one assignment. Anything the fast path does not recognise goes through
:meth:`LeafCaster.coerce`, which applies the casting rule or raises an error naming the leaf.

Example:
    >>> import numpy as np
    >>> caster = LeafCaster(".x", np.dtype("int32"), ())
    >>> caster.coerce(np.int8(3))
    array(3, dtype=int32)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

import ml_dtypes
import numpy as np

from pytreestore._format import dtypes as _dtypes
from pytreestore._format import dtypes as _prng
from pytreestore._tree.device import DEVICE_TYPES, DeviceLeaves, is_device_array
from pytreestore.errors import SchemaMismatchError

#: the widest record given generated code
MAX_COLUMNS = 256


#: what a column takes as it is: (exact types, dtype or None, per-record shape)
Facts = tuple[frozenset | set, np.dtype | None, tuple[int, ...]]


Fill = Callable[[Sequence[Any], int], None]


Slow = Callable[[int, Any, int], None]


Keep = Callable[[tuple[int, int, Any]], None]


def compile_fill(
    facts: Sequence[Facts], name: str, device: set[type] | None = None
) -> Callable[[Sequence[np.ndarray], Slow, Keep | None], Fill] | None:
    """A factory ``make(buffers, slow, keep) -> fill(leaves, row)`` for columns of ``facts``
    (None past :data:`MAX_COLUMNS`, or for no column); ``name`` labels the generated code in
    tracebacks. With ``device`` (a set of ``jax.Array`` classes, which may grow), a leaf of
    one of those classes with the column's dtype and shape is given to ``keep((row, column,
    leaf))`` instead of being assigned."""
    count = len(facts)
    if not 0 < count <= MAX_COLUMNS:
        return None
    names = ", ".join(f"v{i}" for i in range(count))
    body = [f"    {names}, = leaves"]
    for i, (_, dtype, _) in enumerate(facts):
        test = f"type(v{i}) in E{i}"
        if dtype is not None:
            test += f" or (type(v{i}) is ndarray and v{i}.dtype is D{i} and v{i}.shape == S{i})"
        body += [f"    if {test}:", f"        B{i}[row] = v{i}"]
        if device is not None and dtype is not None:
            body += [
                f"    elif type(v{i}) in DEVICE and v{i}.aval.dtype == D{i}"
                f" and v{i}.aval.shape == S{i}:",
                f"        keep((row, {i}, v{i}))",
            ]
        body += ["    else:", f"        slow({i}, v{i}, row)"]
    buffers = ", ".join(f"B{i}" for i in range(count))
    source = "\n".join(
        [
            f"def make({buffers}, slow, keep):",
            "    def fill(leaves, row):",
            *("    " + line for line in body),
            "    return fill",
        ]
    )
    scope: dict[str, Any] = {"ndarray": np.ndarray, "DEVICE": device}
    for i, (exact, dtype, shape) in enumerate(facts):
        scope[f"E{i}"], scope[f"D{i}"], scope[f"S{i}"] = frozenset(exact), dtype, shape
    code = compile(source, f"<pytreestore fill of {name}>", "exec")
    exec(code, scope)
    factory = scope["make"]

    def make(buffers: Sequence[np.ndarray], slow: Slow, keep: Keep | None = None) -> Fill:
        return factory(*buffers, slow, keep)

    return make


_SUFFIX = "Leaf shapes and dtypes are fixed when the store is created."


class LeafCaster:
    """Converts values for the column at ``path`` of ``dtype`` and per-record ``shape``."""

    __slots__ = ("dtype", "exact", "key_impl", "path", "python_types", "shape")

    def __init__(
        self, path: str, dtype: np.dtype, shape: tuple[int, ...], key_impl: str | None = None
    ) -> None:
        self.path = path
        self.dtype = dtype
        self.shape = shape
        self.key_impl = key_impl
        plain = shape == () and key_impl is None
        self.python_types = _dtypes.python_kinds_accepted(dtype) if plain else frozenset()
        #: types assigned without any check: accepted Python scalars and the column's own
        #: numpy scalar type
        self.exact = self.python_types | ({dtype.type} if plain else set())

    def _error(self, got: str, why: str = "", what: str = "record") -> SchemaMismatchError:
        want = _dtypes.describe(self.dtype, self.shape)
        where = self.path or "the root"
        return SchemaMismatchError(
            f"{what} does not match the store schema at {where}: expected {want}, got {got}. "
            f"{why}{_SUFFIX}"
        )

    def coerce(self, value: Any, *, batch: int | None = None, what: str = "record") -> np.ndarray:
        """``value`` as an array of the column's dtype and shape (``(batch, *shape)``)."""
        shape = self.shape if batch is None else (batch, *self.shape)
        if self.key_impl is not None or _prng.is_key(value):
            value = self._key_data(value, what)
        if type(value) in (bool, int, float, complex):
            return self._coerce_python(value, shape, what)
        if not isinstance(value, np.ndarray | np.generic) and not hasattr(value, "__array__"):
            raise self._error(f"a {type(value).__name__}", what=what)
        array = np.asarray(value)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        src = array.dtype
        if src is self.dtype and array.shape == shape:
            return array
        got = _dtypes.describe(src, array.shape)
        if not _dtypes.is_supported(src):
            raise self._error(got, "Columns hold numbers and bools only. ", what)
        if array.shape != shape:
            raise self._error(got, what=what)
        if not _dtypes.can_cast(src, self.dtype):
            raise self._error(
                got,
                f"{src} cannot be cast to {self.dtype} without changing its kind (numpy's "
                f"same_kind rule); cast it yourself, e.g. value.astype('{self.dtype}'). ",
                what,
            )
        if _dtypes.needs_range_check(src, self.dtype) and not _dtypes.fits(array, self.dtype):
            raise self._error(
                got, f"its values do not fit in {self.dtype} and would wrap around. ", what
            )
        with np.errstate(over="ignore"):  # an overflow is refused just below
            out = array.astype(self.dtype, copy=False)
        if _overflows(array, out):
            raise self._error(got, _overflow_why(self.dtype), what)
        return out

    def _key_data(self, value: Any, what: str) -> np.ndarray:
        if self.key_impl is None:
            raise self._error(
                f"a PRNG key array ({_prng.impl_of(value)})",
                "Store keys in a column made from a key (jax.random.key), or store "
                "jax.random.key_data(key) in a uint32 column. ",
                what,
            )
        try:
            return _prng.unwrap(value, self.key_impl, self.path or "the root")
        except TypeError as err:
            raise SchemaMismatchError(f"{what} does not match the store schema: {err}") from err

    def _coerce_python(self, value: Any, shape: tuple[int, ...], what: str) -> np.ndarray:
        got = f"Python {type(value).__name__} {value!r}"
        if shape != self.shape or self.shape != ():
            raise self._error(got, what=what)
        if type(value) not in self.python_types:
            raise self._error(
                got,
                f"a Python {type(value).__name__} cannot be cast to {self.dtype} (numpy's "
                "same_kind rule). ",
                what,
            )
        try:
            with np.errstate(over="ignore"):  # an overflow is refused just below
                out = np.asarray(value, dtype=self.dtype)
            overflow = _overflows(np.asarray(value), out)
        except OverflowError as err:
            raise self._error(got, f"it does not fit in {self.dtype}. ", what) from err
        if overflow:
            raise self._error(got, _overflow_why(self.dtype), what)
        return out


def _overflows(src: np.ndarray, out: np.ndarray) -> bool:
    """Whether a cast turned finite values into infinities (or NaN: float8 has no inf)."""
    if _dtypes.kind(out.dtype) not in "fc" or out.dtype == src.dtype:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.any(~np.isfinite(out) & np.isfinite(src)))


def _overflow_why(dtype: np.dtype) -> str:
    return (
        f"its values are finite but too large for {dtype} and would become infinite; "
        f"scale them or store them in a wider column. "
    )


def _float_top(dtype: np.dtype) -> float | None:
    """The largest finite value of a real float column narrower than float64, else None."""
    if _dtypes.kind(dtype) != "f" or dtype.itemsize >= 8:
        return None
    return float(ml_dtypes.finfo(dtype).max)


def casters(columns: Sequence[Any]) -> list[LeafCaster]:
    """One :class:`LeafCaster` per column spec."""
    return [LeafCaster(c.path, c.dtype, c.shape, c.key_impl) for c in columns]


class RowFiller:
    """Copies one record's leaves into row ``row`` of per-column buffers.

    With ``device``, a :class:`~pytreestore._tree.device.DeviceLeaves`, a ``jax.Array`` leaf of
    the column's dtype and shape goes there instead (a CPU array is copied into its row; an
    accelerator's is copied on its device and fetched when the chunk is written:
    :func:`~pytreestore._tree.device.fetch`), so that appending a jitted step's result does
    not wait for the step, and survives the step donating it.
    """

    def __init__(
        self,
        leaf_casters: Sequence[LeafCaster],
        buffers: Sequence[np.ndarray],
        device: DeviceLeaves | None = None,
    ) -> None:
        self._casters = list(leaf_casters)
        self.device = device
        #: per column, the largest finite value of a narrow float column (None: no check)
        self._tops = [_float_top(c.dtype) for c in leaf_casters]
        # a Python float into a narrow float column is checked for overflow (top), so it is
        # not taken as it is; a key column's values always go through coerce (dtype None)
        self._facts = [
            (
                c.exact - {float} if top is not None else c.exact,
                c.dtype if c.key_impl is None else None,
                c.shape,
            )
            for c, top in zip(self._casters, self._tops)
        ]
        self._make = compile_fill(
            self._facts, f"{len(self._facts)} columns", DEVICE_TYPES if device else None
        )
        self.use(buffers)

    def use(self, buffers: Sequence[np.ndarray]) -> None:
        """Fills ``buffers`` from now on (a writer's next chunk)."""
        self.buffers = list(buffers)
        self._fast = [
            (exact, dtype, shape, b, c.coerce, top, i)
            for i, ((exact, dtype, shape), c, b, top) in enumerate(
                zip(self._facts, self._casters, buffers, self._tops)
            )
        ]
        whole = self._make is not None and len(self.buffers) == len(self._facts)
        keep = self.device.kept.append if self.device is not None else None
        self._fill = self._make(buffers, self._slow, keep) if whole else None  # type: ignore[misc]

    def fill(self, leaves: Sequence[Any], row: int) -> None:
        """Writes ``leaves`` into ``row``; raises SchemaMismatchError, leaving other rows intact
        (and keeping none of this record's device arrays).

        Raises:
            LostLeaf: a device array of this record is deleted, or (on the host) its
                computation failed (:meth:`~pytreestore._tree.device.DeviceLeaves.own`).
        """
        device = self.device
        mark = len(device.kept) if device is not None else 0
        try:
            if self._fill is not None:
                self._fill(leaves, row)  # the generated straight-line code (fillcode)
                if device is not None and len(device.kept) > mark:
                    device.own(mark, self.buffers)
                return
            for (exact, dtype, shape, buf, _, _, i), leaf in zip(self._fast, leaves):
                kind = type(leaf)
                if kind in exact or (
                    kind is np.ndarray and leaf.dtype is dtype and leaf.shape == shape
                ):
                    buf[row] = leaf
                else:
                    self._slow(i, leaf, row)
            if device is not None and len(device.kept) > mark:
                device.own(mark, self.buffers)
        except BaseException as err:
            if device is not None:
                device.forget(row)
            if isinstance(err, OverflowError | TypeError | ValueError) and not isinstance(
                err, SchemaMismatchError
            ):
                for caster, leaf in zip(self._casters, leaves):
                    caster.coerce(leaf)
            raise

    def _slow(self, column: int, leaf: Any, row: int) -> None:
        """Column ``column``'s leaf that is not taken as it is: a Python float checked against
        a narrow float column's range, a device array kept, or the casting rule."""
        _, dtype, shape, buf, coerce, top, _ = self._fast[column]
        if top is not None and shape == () and type(leaf) is float and -top <= leaf <= top:
            buf[row] = leaf
        elif self.device is not None and _keeps(leaf, dtype, shape):
            self.device.keep(row, column, leaf)
        else:
            buf[row] = coerce(leaf)

    def fill_block(self, rows: Sequence[Sequence[Any]], at: int) -> None:
        """Writes many records' leaves into rows ``at, at + 1, ...``, one column at a time
        (:meth:`fill_columns` of the rows' columns).

        Raises:
            RecordError: record ``rows[error.index]`` was refused.
        """
        self.fill_columns(list(zip(*rows)), at, len(rows))

    def fill_columns(self, columns: Sequence[Sequence[Any]], at: int, count: int) -> None:
        """Writes ``count`` records given as ``columns`` (per column, each record's value)
        into rows ``at, at + 1, ...``.

        A column whose values are all of an exact type (accepted Python scalars, the column's
        numpy scalar type, or arrays of its dtype and shape) is converted in one numpy call;
        anything else goes record by record.

        Raises:
            RecordError: record ``error.index`` (counted from the first of ``columns``) was
                refused.
        """
        try:
            with np.errstate(over="ignore"):  # overflows are found below and refused
                self._fill_columns(columns, at, count)
        except (OverflowError, TypeError, ValueError):
            # many records at once: device arrays are copied now (the loop, no device)
            saved, (self.device, self._fill) = (self.device, self._fill), (None, None)
            try:
                for i, leaves in enumerate(zip(*columns)):
                    try:
                        self.fill(leaves, at + i)
                    except SchemaMismatchError as err:
                        raise RecordError(i, err) from err
            finally:
                self.device, self._fill = saved

    def _fill_columns(self, columns: Sequence[Sequence[Any]], at: int, count: int) -> None:
        for (_, dtype, shape, buf, _, top, i), column in zip(self._fast, columns):
            exact = self._casters[i].exact
            block = buf[at : at + count]
            _fill_column(block, column, exact, dtype, shape)
            if top is not None and not np.isfinite(block).all():
                raise ValueError("non-finite values: check record by record")


def _keeps(leaf: Any, dtype: np.dtype | None, shape: tuple[int, ...]) -> bool:
    """Whether ``leaf`` is a device array a fill keeps for its column, as it is."""
    return (
        (type(leaf) in DEVICE_TYPES or is_device_array(leaf))
        and leaf.dtype == dtype
        and leaf.shape == shape
    )


def _fill_column(
    out: np.ndarray,
    column: Sequence[Any],
    exact: frozenset,
    dtype: np.dtype | None,
    shape: tuple,
) -> None:
    types = set(map(type, column))
    if types <= exact or (
        types == {np.ndarray}
        and all(d is dtype and s == shape for d, s in set(map(_DTYPE_SHAPE, column)))
    ):
        out[...] = column
    else:
        raise ValueError("mixed leaf types: convert record by record")


#: an array's dtype and shape, taken by one C call per array
_DTYPE_SHAPE = attrgetter("dtype", "shape")


class RecordError(Exception):
    """Record ``index`` of a block was refused with ``error`` (internal)."""

    def __init__(self, index: int, error: SchemaMismatchError) -> None:
        super().__init__(index, error)
        self.index = index
        self.error = error


__all__ = ["MAX_COLUMNS", "compile_fill"]
