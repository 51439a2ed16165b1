"""A ``jax.Array`` that cannot be read (deleted, or the computation that made it failed) is
refused by every call that takes records, on every store kind, as the fixed store's
``append`` refuses it (issue 44): :class:`~pytreestore.errors.DeletedArrayError` or
:class:`~pytreestore.errors.DeviceFetchError` naming the record and the keypath, never JAX's
own error, and nothing appended: the store's length, later appends and the records read
back are as if the call had not been made.

Before, a ragged or optional store (which copies device arrays at ``append``), ``extend``,
``extend_batch``, ``stack`` and ``write_fragment`` of any store, and a fixed store's
``append`` of an array it casts, let JAX's ``RuntimeError``/``JaxRuntimeError`` through."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore import errors
from pytreestore.backends import ocdbt_coordinator
from tests import model_device
from tests.parity import kinds

BACKENDS = ("tensorstore", "ocdbt", "zarr")
HOWS = ("failed", "deleted")
ERRORS = {"failed": errors.DeviceFetchError, "deleted": errors.DeletedArrayError}
WHY = {"failed": "could not be fetched from its device", "deleted": "is deleted"}

#: per kind, the keypath spoiled: a leaf the kind's tables hold (a fixed store's: one it
#: casts, int32 values into a float32 column, which takes the copying path)
SPOILED = {
    "fixed": ".x",
    "ragged_list": ".agents[0].pos",
    "ragged_axis": ".trail",
    "optional": ".storm.cells",
    "nested": ".agents[0].events[0]",
}


@pytest.fixture(autouse=True)
def _clean_exit() -> Iterator[None]:
    """After a test, a good callback on the CPU device of the failed arrays, so that JAX's
    exit does not raise a failed one's error (a new jit each time: a cached one takes a fast
    path, which leaves the last callback's token; tests.model_device.failed)."""
    yield
    ok = jax.jit(lambda x: jax.pure_callback(np.asarray, jax.ShapeDtypeStruct((1,), x.dtype), x))
    np.asarray(ok(jax.device_put(np.ones(1, np.float32), jax.devices("cpu")[0])))


def _bad(value: Any, how: str) -> jax.Array:
    """A ``jax.Array`` of ``value``'s dtype and shape that cannot be read."""
    device = jax.devices("cpu")[0]
    if how == "failed":
        return model_device.failed(value, device)
    array = jax.device_put(np.asarray(value), device)
    array.delete()
    return array


def _spoiled(name: str, record: Any, how: str) -> Any:
    """``record`` with the leaf at ``SPOILED[name]`` unreadable."""
    if name == "fixed":
        return record.replace(x=_bad(np.asarray(record.x).astype(np.int32), how))
    if name == "ragged_axis":
        return record.replace(trail=_bad(record.trail, how))
    if name == "optional":
        return record.replace(storm=record.storm.replace(cells=_bad(record.storm.cells, how)))
    agents = list(record.agents)
    if name == "ragged_list":
        agents[0] = agents[0].replace(pos=_bad(agents[0].pos, how))
    else:
        events = list(agents[0].events)
        events[0] = _bad(events[0], how)
        agents[0] = agents[0].replace(events=events)
    return record.replace(agents=agents)


def _record(name: str, i: int) -> Any:
    """Record ``i`` of kind ``name``, with every list and optional subtree the spoiling needs."""
    like: Any = kinds.like(name)
    record = like.replace(t=np.int32(i), x=np.full(4, i, np.float32))
    if name == "ragged_axis":
        record = record.replace(trail=np.full((i % 3 + 1, 2), i, np.float32))
    return record


def _stack(name: str, records: list[Any]) -> Any:
    """``records`` stacked with kind ``name``'s declarations: the batch, and its mask (None
    for a fixed store)."""
    kind = kinds.kind(name)
    if kind.is_fixed:
        return pytreestore.stack(records), None
    return pytreestore.stack(records, ragged=kind.ragged or None, optional=kind.optional or None)


def _read(path: Any, backend: str) -> list[Any]:
    with pytreestore.open(path, backend=backend) as store:
        return [jax.tree.map(np.asarray, r) for r in store]


def _check_unchanged(store: Any, path: Any, name: str, backend: str, count: int) -> None:
    """The store still holds ``count`` records; one more append and close keep exactly
    records ``0 .. count``."""
    assert len(store) == count
    store.append(_record(name, count))
    store.close()
    got = _read(path, backend)
    assert len(got) == count + 1
    for i, record in enumerate(got):
        kinds.assert_same(record, _record(name, i))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", kinds.KINDS)
@pytest.mark.parametrize("how", HOWS)
def test_append_refuses_an_unreadable_array(tmp_path, backend, name, how):
    path = tmp_path / "s"
    store = kinds.create(path, name, backend, chunk_records=2)
    for i in range(3):
        store.append(_record(name, i))
    with pytest.raises(ERRORS[how]) as info:
        store.append(_spoiled(name, _record(name, 3), how))
    text = str(info.value)
    assert text.startswith(f"record 3's jax.Array at {SPOILED[name]} {WHY[how]}"), text
    assert text.endswith("Nothing was appended: append a record whose arrays are valid.")
    assert "\n" not in text
    _check_unchanged(store, path, name, backend, 3)


@pytest.mark.parametrize("name", kinds.KINDS)
@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("given", ["list", "generator"])
def test_extend_refuses_an_unreadable_array(tmp_path, name, how, given):
    path = tmp_path / "s"
    store = kinds.create(path, name, "tensorstore", chunk_records=2)
    store.append(_record(name, 0))
    records = [_record(name, 1), _record(name, 2), _spoiled(name, _record(name, 3), how)]
    with pytest.raises(ERRORS[how]) as info:
        store.extend(records if given == "list" else iter(records))
    assert str(info.value).startswith(
        "extend() refused record 2 (none of this call's records were appended): its "
        f"jax.Array at {SPOILED[name]} {WHY[how]}"
    )
    _check_unchanged(store, path, name, "tensorstore", 1)


@pytest.mark.parametrize("name", kinds.KINDS)
@pytest.mark.parametrize("how", HOWS)
def test_extend_batch_refuses_an_unreadable_array(tmp_path, name, how):
    path = tmp_path / "s"
    store = kinds.create(path, name, "tensorstore")
    store.append(_record(name, 0))
    batch, mask = _stack(name, [_record(name, 1), _record(name, 2)])
    batch = batch.replace(x=_bad(batch.x, how))
    with pytest.raises(ERRORS[how], match=re.escape(f"its jax.Array at .x {WHY[how]}")) as info:
        store.extend_batch(batch, mask)
    assert str(info.value).startswith(
        "extend_batch() refused the batch (none of its records were appended)"
    )
    _check_unchanged(store, path, name, "tensorstore", 1)


@pytest.mark.parametrize("name", kinds.KINDS)
@pytest.mark.parametrize("how", HOWS)
def test_stack_refuses_an_unreadable_array(name, how):
    records = [_record(name, 0), _spoiled(name, _record(name, 1), how)]
    with pytest.raises(ERRORS[how]) as info:
        _stack(name, records)
    assert str(info.value).startswith(
        f"stack() refused record 1: its jax.Array at {SPOILED[name]} {WHY[how]}"
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["fixed", "nested"])
@pytest.mark.parametrize("how", HOWS)
def test_write_fragment_refuses_an_unreadable_array(tmp_path, backend, name, how):
    path = tmp_path / "s"
    kinds.create(path, name, backend).close()
    records = [_record(name, 0), _spoiled(name, _record(name, 1), how)]
    with pytest.raises(ERRORS[how]) as info:
        pytreestore.write_fragment(path, records, backend=backend)
    assert str(info.value).startswith(
        f"write_fragment() refused record 1 (nothing was written): its jax.Array at "
        f"{SPOILED[name]} {WHY[how]}"
    )
    batch, mask = _stack(name, [_record(name, 0), _record(name, 1)])
    with pytest.raises(ERRORS[how], match=r"write_fragment\(\) refused the batch"):
        pytreestore.write_fragment(path, batch.replace(x=_bad(batch.x, how)), mask=mask)
    fragment = pytreestore.write_fragment(path, [_record(name, 0)], backend=backend)
    with pytreestore.open(path, mode="a", backend=backend) as store:
        store.commit_fragments([fragment])
    got = _read(path, backend)
    assert len(got) == 1
    kinds.assert_same(got[0], _record(name, 0))


@pytest.mark.parametrize("name", ["fixed", "nested"])
@pytest.mark.parametrize("how", HOWS)
def test_a_coordinated_writer_refuses_an_unreadable_array(tmp_path, name, how):
    """A writer sharing an OCDBT store (``coordinator=``) refuses as the store's writer."""
    path = tmp_path / "s"
    kinds.create(path, name, "ocdbt").close()
    with ocdbt_coordinator() as address:
        store = pytreestore.open(path, "a", backend="ocdbt", coordinator=address)
        store.append(_record(name, 0))
        with pytest.raises(
            ERRORS[how], match=re.escape(f"record 1's jax.Array at {SPOILED[name]}")
        ):
            store.append(_spoiled(name, _record(name, 1), how))
        with pytest.raises(ERRORS[how], match=r"extend\(\) refused record 1 \(none"):
            store.extend([_record(name, 1), _spoiled(name, _record(name, 2), how)])
        _check_unchanged(store, path, name, "ocdbt", 1)
