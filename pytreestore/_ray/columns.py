"""The Ray column of each leaf, the same for the datasink and the datasource.

Each leaf of the store's records is one Ray column, named by the leaf's keypath in JAX's
simple form (``jax.tree_util.keystr(path, simple=True, separator=".")``) with the ``[*]`` of
ragged lists left out: ``{"x": ..., "meta": {"lr": ...}}`` reads columns ``x`` and
``meta.lr``, a dataclass ``Params(w, b)`` reads ``w`` and ``b``, a list ``[a, b]`` reads ``0``
and ``1``, ``.p[*].x`` reads ``p.x``, and a store of bare arrays reads ``item`` (the column
``ray.data.from_items`` makes of non-dict items). The datasink's ``columns=`` renames any of
them: ``{"['meta']['lr']": "learning_rate"}``, keypaths as in ``store.schema.paths``.

Example:
    >>> import numpy as np, pytreestore
    >>> store = pytreestore.create("memory://doc-ray-columns", {"x": np.float32(0), "m": {"lr": 0.0}})
    >>> column_names(store.schema), column_names(store.schema, {"['m']['lr']": "lr"})
    (['m.lr', 'x'], ['lr', 'x'])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pytreestore._format.schema import TreeSchema
from pytreestore._tree import leaf_columns
from pytreestore.errors import ArgumentTypeError, SchemaMismatchError, UnknownColumnError


def column_names(schema: TreeSchema, columns: Mapping[str, str] | None = None) -> list[str]:
    """The Ray column of each of the store's columns, in column order (module docstring).

    Raises:
        UnknownColumnError: ``columns`` names a keypath the store has no column at.
        SchemaMismatchError: two leaves would read the same Ray column.
    """
    names = leaf_columns.column_names(schema)
    paths = schema.paths
    for keypath, name in (columns or {}).items():
        if keypath not in paths:
            raise UnknownColumnError(
                f"columns= names {keypath!r}, which is no column of the store; its columns are "
                f"{', '.join(paths)}"
            )
        if not isinstance(name, str):
            raise ArgumentTypeError(
                f"columns= maps keypaths to Ray column names (str), got {name!r}"
            )
        names[paths.index(keypath)] = name
    seen: dict[str, str] = {}
    for path, name in zip(paths, names):
        if name in seen:
            raise SchemaMismatchError(
                f"the leaves at {seen[name]} and {path} would both read the Ray column "
                f"{name!r}; give one of them its own column with columns={{{path!r}: 'name'}}"
            )
        seen[name] = path
    return names


def check_columns(
    names: list[str], got: Iterable[str], path: str, pending: Iterable[str] = ()
) -> None:
    """Refuses a block (or a dataset schema) whose columns are not exactly ``names``
    (``pending``: a ragged store's structures still unknown, named in the message).

    Raises:
        SchemaMismatchError: columns are missing or left over; the message lists them.
    """
    got = list(got)
    missing = [n for n in names if n not in got]
    extra = [n for n in got if n not in names]
    if not missing and not extra:
        return
    problems = []
    if missing:
        problems.append(f"missing the columns {missing}")
    if extra:
        problems.append(f"with columns no leaf reads: {extra} (drop them: ds.drop_columns)")
    pending = list(pending)
    if extra and pending:
        problems.append(
            f"the store has not learnt the structures at {pending} yet (no record showed an "
            "element or a subtree there), so no column reads them: append one record that "
            "shows them first (store.append)"
        )
    raise SchemaMismatchError(
        f"the dataset does not match store {path}: {'; '.join(problems)}. The store's leaves "
        f"read the Ray columns {names} (rename with ds.rename_columns, or map keypaths to "
        "columns with TreeStoreDatasink(..., columns={keypath: column}))"
    )


__all__ = ["check_columns", "column_names"]
