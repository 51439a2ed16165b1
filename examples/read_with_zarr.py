"""Reading a pytreestore store with zarr-python alone (and xarray, where it is installed).

A store is a zarr v3 group: one array per leaf, at the leaf's keypath; the schema (the tree,
and every column's keypath, key, dtype and shape) is JSON in the root group's attributes; the
number of committed records is in ``.pytreestore/commit.json``. So any zarr v3 reader can read
one, without pytreestore and without the classes of the records.

This script writes a small store of simulation-like records with pytreestore, then reads it
back with zarr-python only (``read_with_zarr`` imports neither pytreestore nor the classes),
rebuilds the records as nested dicts and lists from the schema, and checks every value
against pytreestore's own load. With xarray installed, it also opens one node of the tree
as an ``xarray.Dataset``.

Usage: ``python examples/read_with_zarr.py [DIRECTORY]``: the store is written to
``DIRECTORY/particles.pytreestore``, or to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from flax import struct

# --- writing, with pytreestore ---------------------------------------------------------------


class Body(NamedTuple):
    position: np.ndarray  # float32[3]
    velocity: np.ndarray  # float32[3]


@struct.dataclass
class Particle:
    body: Body
    charge: np.float32
    tags: dict[str, np.ndarray]  # "alive": bool, "bounces": int16


@struct.dataclass
class State:
    step: int
    particles: list[Particle]
    label: str = struct.field(pytree_node=False, default="box")


N_RECORDS, N_PARTICLES = 50, 2


def make_state(step: int) -> State:
    rng = np.random.default_rng(step)
    particles = [
        Particle(
            body=Body(
                position=rng.normal(size=3).astype(np.float32),
                velocity=rng.normal(size=3).astype(np.float32),
            ),
            charge=np.float32((-1) ** p),
            tags={"alive": np.bool_(step < 40), "bounces": np.int16(step // 7)},
        )
        for p in range(N_PARTICLES)
    ]
    return State(step=step, particles=particles)


def write(path: Path) -> None:
    import pytreestore

    with pytreestore.create(path, like=make_state(0), chunk_records=16, overwrite=True) as store:
        store.extend(make_state(i) for i in range(N_RECORDS))


# --- reading, with zarr-python only ----------------------------------------------------------


def read_with_zarr(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The store's schema, and every column's committed values by keypath, via zarr only."""
    import zarr

    records = json.loads((path / ".pytreestore" / "commit.json").read_text())["records"]
    root = zarr.open_group(path, mode="r")
    schema = root.attrs["pytreestore"]
    columns = {}
    for column in schema["columns"]:
        array = root[column["key"]]  # a zarr.Array; it may be longer than the commit
        columns[column["path"]] = array[:records]
    return schema, columns


def rebuild(node: dict[str, Any], leaves: Any) -> Any:
    """The tree described by a schema ``node``, as dicts and lists around ``leaves``."""
    kind = node["node"]
    if kind == "leaf":
        return next(leaves)
    if kind == "none":
        return None
    children = [rebuild(child, leaves) for child in node.get("children", [])]
    if kind in ("list", "tuple"):
        return children
    if kind in ("dict", "ordered_dict"):
        names = node["keys"]
    elif kind == "namedtuple":
        names = node["fields"]
    else:  # a custom node: a dataclass, say; each key is {"attr": name}, {"key": k}, ...
        names = [next(iter(entry.values())) for entry in node["keys"]]
    out = dict(zip(map(str, names), children, strict=True))
    if kind in ("custom", "namedtuple"):
        out["__class__"] = node["type"]  # "module:qualname", for the reader's information
    return out


def record(tree: Any, i: int) -> Any:
    """Record ``i`` of a rebuilt batch: every leaf indexed at ``i``."""
    if isinstance(tree, dict):
        return {k: v if k == "__class__" else record(v, i) for k, v in tree.items()}
    if isinstance(tree, list):
        return [record(v, i) for v in tree]
    return None if tree is None else tree[i]


# --- the example -----------------------------------------------------------------------------


def main(root: Path) -> None:
    path = root / "particles.pytreestore"
    write(path)
    print(f"wrote {N_RECORDS} records to {path} with pytreestore")

    schema, columns = read_with_zarr(path)
    print(f"read {len(columns)} columns with zarr-python, format {schema['format_version']}:")
    for keypath, values in columns.items():
        print(f"   {keypath:<40} {values.dtype.name:>8} {list(values.shape)}")
    batch = rebuild(schema["tree"], iter(columns.values()))
    last = record(batch, N_RECORDS - 1)
    print(f"record {N_RECORDS - 1}, rebuilt as dicts from the schema:")
    print(f"   step={last['step']}, class {last['__class__']}")
    tags = {k: v.item() for k, v in last["particles"][1]["tags"].items()}
    print(f"   particles[1].tags={tags}")

    check(path, columns, last)
    print("every value matches pytreestore's load")

    if importlib.util.find_spec("xarray") is not None:
        show_xarray(path, len(next(iter(columns.values()))))
    else:
        print("xarray is not installed: skipped reading with xarray")
    print("read_with_zarr example OK")


def check(path: Path, columns: dict[str, np.ndarray], last: dict[str, Any]) -> None:
    import jax

    import pytreestore

    store = pytreestore.open(path)
    ours = jax.tree_util.tree_flatten_with_path(store.load(as_numpy=True))[0]
    assert [jax.tree_util.keystr(p) for p, _ in ours] == list(columns), "column order differs"
    for (_, want), got in zip(ours, columns.values(), strict=True):
        assert want.dtype == got.dtype and np.array_equal(want, got)
    expected = make_state(N_RECORDS - 1)
    assert last["step"] == expected.step
    np.testing.assert_array_equal(
        last["particles"][0]["body"]["velocity"], expected.particles[0].body.velocity
    )


def show_xarray(path: Path, records: int) -> None:
    import xarray as xr

    # Each node of the tree is a zarr group; its leaves share the "record" dimension. The
    # root's consolidated metadata lists every node with its committed records.
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # default arguments: nothing to warn about
        ds = xr.open_zarr(path, group="particles/0/body")
    assert ds.sizes["record"] == records
    ds = ds.load()
    print("xarray, group particles/0/body:")
    print(f"   dims {dict(ds.sizes)}, variables {sorted(ds.data_vars)}")
    speed = np.sqrt((ds["velocity"] ** 2).sum("velocity_0"))
    print(f"   mean speed of particle 0 over {records} records: {float(speed.mean()):.3f}")
    assert ds["position"].dims == ("record", "position_0")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
