"""In-memory stacking of ragged records (issue #32): ``pytreestore.stack(records, ragged=...,
optional=..., pad_to=64)`` and ``pytreestore.unstack(batch, mask)``, against the numpy code a
user writes for the same padded arrays and masks.

Each record: a fixed part (``step`` int32[], ``v`` float32[3]), a list ``p`` of 0 to 64
elements (uniform, fixed seed) of a NamedTuple of 6 scalar leaves (4 float32, 2 int32, numpy
scalars), a ragged leading axis ``pos`` float32[0..64, 3] and an optional subtree ``extra``
(a dataclass of a float32[2] and an int32[]) that is None in about half the records.

* **stack**: ``stack(records, ragged=[".p", ".pos"], optional=[".extra"], pad_to=64,
  as_numpy=True)`` against fancy-index padding in numpy: per leaf, the values of every record
  gathered (``zip(*elements)`` for the list's fields, ``np.concatenate`` for ``pos``,
  ``np.stack`` for the present ``extra``), converted with one ``np.array`` and assigned into a
  zero array through a mask built from the lengths (``np.arange(64) < lengths[:, None]``).
* **stack (jax.Array leaves)**: the same with ``as_numpy=False`` (the default), against the
  numpy code followed by one ``jax.device_put`` of its arrays; both wait for the transfers.
* **unstack**: ``unstack(batch, mask)`` of that result against the user's own slicing loop:
  per record, the list's elements rebuilt from the rows of its leaves cut to its length
  (``map(Particle, *(leaf[i, :n] for leaf in p))``), ``pos[i, :m]``, ``extra`` where present.

Outputs are checked against the expected values outside the timed regions.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np
from _common import Case, Result, Timed, at_most, measure_side_by_side
from flax import struct

import pytreestore

TITLE = "stack / unstack of ragged records (#32)"

PAD = 64
F32, I32 = np.dtype(np.float32), np.dtype(np.int32)
DTYPES = (F32, F32, F32, F32, I32, I32)  # the fields of Particle
RAGGED = [".p", ".pos"]
OPTIONAL = [".extra"]


@dataclass(frozen=True)
class Sizes:
    n: int
    repeats: int


FULL = Sizes(n=4_000, repeats=7)
QUICK = Sizes(n=400, repeats=3)


class Particle(NamedTuple):
    x: Any
    y: Any
    z: Any
    mass: Any
    id: Any
    kind: Any


@struct.dataclass
class Extra:
    w: Any  # float32[2]
    c: Any  # int32[]


@struct.dataclass
class Record:
    step: Any  # int32[]
    v: Any  # float32[3]
    p: Any  # list of Particle (padded: a Particle of [records, 64] leaves)
    pos: Any  # float32[L, 3]
    extra: Any  # Extra or None


@struct.dataclass
class Masks:
    """The masks a user's numpy code builds: one per ragged axis, one for ``extra``."""

    p: np.ndarray  # bool[records, 64]
    pos: np.ndarray  # bool[records, 64]
    extra: np.ndarray  # bool[records]


def make_records(n: int) -> list[Record]:
    rng = np.random.default_rng(32)
    lengths = rng.integers(0, PAD + 1, n)
    total = int(lengths.sum())
    fields = [
        list(
            rng.standard_normal(total).astype(dt) if dt == F32 else rng.integers(-99, 99, total, dt)
        )
        for dt in DTYPES
    ]
    elements = list(map(Particle, *fields))
    cuts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    steps = list(np.arange(n, dtype=I32))
    out = []
    for i in range(n):
        m = int(rng.integers(0, PAD + 1))
        extra = (
            Extra(rng.standard_normal(2).astype(F32), I32.type(i)) if rng.random() < 0.5 else None
        )
        out.append(
            Record(
                steps[i],
                rng.standard_normal(3).astype(F32),
                elements[cuts[i] : cuts[i + 1]],
                rng.standard_normal((m, 3)).astype(F32),
                extra,
            )
        )
    gc.freeze()  # long-lived: keep them out of the full collections before each timed run
    return out


def _scatter(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    out = np.zeros((*mask.shape, *values.shape[1:]), values.dtype)
    out[mask] = values
    return out


def numpy_stack(records: Sequence[Record]) -> tuple[Record, Masks]:
    """The padded batch and masks as a user's numpy code builds them (fancy-index padding)."""
    n = len(records)
    step = np.array([r.step for r in records], I32)
    v = np.stack([r.v for r in records])
    lists = [r.p for r in records]
    mask_p = np.arange(PAD) < np.fromiter(map(len, lists), np.int64, n)[:, None]
    columns = zip(*itertools.chain.from_iterable(lists), strict=True)
    p = Particle(*(_scatter(np.array(c, dt), mask_p) for c, dt in zip(columns, DTYPES)))
    axes = [r.pos for r in records]
    mask_pos = np.arange(PAD) < np.fromiter(map(len, axes), np.int64, n)[:, None]
    pos = _scatter(np.concatenate(axes), mask_pos)
    present = np.array([r.extra is not None for r in records])
    extras = [r.extra for r in records if r.extra is not None]
    extra = Extra(
        _scatter(np.stack([e.w for e in extras]), present),
        _scatter(np.array([e.c for e in extras], I32), present),
    )
    return Record(step, v, p, pos, extra), Masks(mask_p, mask_pos, present)


def ours_stack(records: Sequence[Record], *, as_numpy: bool = True) -> tuple[Record, Record]:
    out = pytreestore.stack(
        records, ragged=RAGGED, optional=OPTIONAL, pad_to=PAD, as_numpy=as_numpy
    )
    return out if as_numpy else jax.block_until_ready(out)


def numpy_stack_on_device(records: Sequence[Record]) -> tuple[Record, Masks]:
    """:func:`numpy_stack`, its arrays then put on the device in one ``jax.device_put``."""
    return jax.block_until_ready(jax.device_put(numpy_stack(records)))


def numpy_unstack(batch: Record, masks: Masks) -> list[Record]:
    """The records back from the padded batch, as a user's slicing loop rebuilds them."""
    lengths = masks.p.sum(axis=1).tolist()
    axes = masks.pos.sum(axis=1).tolist()
    present = masks.extra.tolist()
    p, extra = batch.p, batch.extra
    out = []
    for i, (n, m, has) in enumerate(zip(lengths, axes, present, strict=True)):
        elements = list(map(Particle, *(leaf[i, :n] for leaf in p)))
        e = Extra(extra.w[i], extra.c[i, ...]) if has else None
        out.append(Record(batch.step[i, ...], batch.v[i], elements, batch.pos[i, :m], e))
    return out


def _check_stack(got: tuple[Record, Record], want: tuple[Record, Masks]) -> None:
    batch, mask = got
    expected, masks = want
    for k, (g, e) in enumerate(zip(jax.tree.leaves(batch), jax.tree.leaves(expected), strict=True)):
        if not (type(g) is np.ndarray and g.dtype == e.dtype and np.array_equal(g, e)):
            raise RuntimeError(f"stack: leaf {k}: expected {e.dtype}{list(e.shape)}, got {g!r:.80}")
    want_masks = _as_mask(masks)
    for g, e in zip(jax.tree.leaves(mask), jax.tree.leaves(want_masks), strict=True):
        if not (g.dtype == bool and np.array_equal(g, e)):
            raise RuntimeError("stack: the mask differs from the lengths and presence")


def _same(got: Any, want: Any) -> bool:
    a, b = jax.tree.leaves(got), jax.tree.leaves(want)
    return (
        jax.tree.structure(got) == jax.tree.structure(want)
        and len(a) == len(b)
        and all(
            np.asarray(x).dtype == np.asarray(y).dtype
            and np.shape(x) == np.shape(y)
            and np.array_equal(x, y)
            for x, y in zip(a, b, strict=True)
        )
    )


def _check_unstack(got: list[Record], records: Sequence[Record]) -> None:
    if len(got) != len(records):
        raise RuntimeError(f"unstack: {len(got)} records, expected {len(records)}")
    for i in range(0, len(records), max(1, len(records) // 97)):
        if not _same(got[i], records[i]):
            raise RuntimeError(f"unstack: record {i} differs from the record stacked")


def _case_stack(sizes: Sizes, *, as_numpy: bool = True) -> list[Result]:
    records = make_records(sizes.n)
    want = numpy_stack(records)
    on_host = (lambda t: jax.tree.map(np.asarray, t)) if not as_numpy else (lambda t: t)
    ours, base = measure_side_by_side(
        Timed(
            lambda _: ours_stack(records, as_numpy=as_numpy),
            sizes.repeats,
            warmup=1,
            teardown=lambda _, out: _check_stack(on_host(out), want),
        ),
        Timed(
            lambda _: numpy_stack(records) if as_numpy else numpy_stack_on_device(records),
            sizes.repeats,
            warmup=1,
            teardown=lambda _, out: _check_stack(on_host((out[0], _as_mask(out[1]))), want),
        ),
    )
    elements = sum(len(r.p) for r in records)
    device = "" if as_numpy else ", then `jax.device_put` of the batch and masks"
    return [
        Result(
            case="stack" if as_numpy else "stack (jax.Array leaves)",
            n=sizes.n,
            ours=ours,
            baseline=base,
            goal=at_most(2.0),
            higher_is_better=False,
            ours_label=(
                f"`stack(records, ragged={RAGGED}, optional={OPTIONAL}, pad_to={PAD}, "
                f"as_numpy={as_numpy})`"
            ),
            baseline_label=(
                "numpy fancy-index padding: per leaf, the values gathered, one `np.array`, "
                f"assigned into zeros through a mask built from the lengths{device}"
            ),
            notes=(
                f"{elements:,} list elements in all. Per record: ours "
                f"{ours.median / sizes.n * 1e6:.1f} us, numpy {base.median / sizes.n * 1e6:.1f} us.",
            ),
        )
    ]


def _as_mask(masks: Masks) -> Record:
    """The user's masks in the structure of ours (for the one check of both outputs)."""
    n = len(masks.extra)
    return Record(
        np.ones(n, bool),
        np.ones(n, bool),
        Particle(*[masks.p] * len(DTYPES)),
        masks.pos,
        Extra(masks.extra, masks.extra),
    )


def _case_unstack(sizes: Sizes) -> list[Result]:
    records = make_records(sizes.n)
    batch, mask = ours_stack(records)
    _, masks = numpy_stack(records)
    ours, base = measure_side_by_side(
        Timed(
            lambda _: pytreestore.unstack(batch, mask),
            sizes.repeats,
            warmup=1,
            teardown=lambda _, out: _check_unstack(out, records),
        ),
        Timed(
            lambda _: numpy_unstack(batch, masks),
            sizes.repeats,
            warmup=1,
            teardown=lambda _, out: _check_unstack(out, records),
        ),
    )
    return [
        Result(
            case="unstack",
            n=sizes.n,
            ours=ours,
            baseline=base,
            goal=at_most(2.0),
            higher_is_better=False,
            ours_label="`unstack(batch, mask)` of the `stack` row's numpy batch and mask",
            baseline_label=(
                "the user's slicing loop: per record, the list's elements rebuilt from its "
                "leaves' rows cut to its length, `pos[i, :m]`, `extra` where present"
            ),
            notes=(
                f"Per record: ours {ours.median / sizes.n * 1e6:.1f} us, numpy "
                f"{base.median / sizes.n * 1e6:.1f} us.",
            ),
        )
    ]


def cases(quick: bool) -> list[Case]:
    sizes = QUICK if quick else FULL
    return [
        Case("stack", lambda: _case_stack(sizes)),
        Case("stack_jax", lambda: _case_stack(sizes, as_numpy=False)),
        Case("unstack", lambda: _case_unstack(sizes)),
    ]
