"""A store version as a storage snapshot: on a backend that keeps every generation
(:class:`~pytreestore.backends.Snapshots`, the OCDBT backend), ``open(path, version=N)`` reads
the generation that committed version N, so that version's rows are pinned by the storage,
not only by its version record.

A commit is one generation where the backend has transactions (:mod:`pytreestore._commit.atomic`),
and several otherwise (a writer sharing the store through an OCDBT coordinator: its resizes,
chunks, version record, commit record and root each land on their own, in that order). Either
way the commit record only ever names higher versions in later generations, and is written
after the rows it counts, so the generation of version N is the first whose commit record
names N, and it holds all of N's rows: found by bisecting the generations, reading one commit
record per step (about 14 for 10,000 generations).

Example:
    >>> import pytreestore
    >>> from pytreestore._location import Location
    >>> from pytreestore.backends import OcdbtBackend
    >>> with pytreestore.create("memory://doc-snapshots", {"x": 0}, backend="ocdbt") as s:
    ...     s.append({"x": 1}); s.flush(); s.append({"x": 2})
    >>> engine = OcdbtBackend(Location.parse("memory://doc-snapshots"))
    >>> generation_of(engine, 1) < generation_of(engine, 2)
    True
"""

from __future__ import annotations

from pytreestore._commit.record import Commit
from pytreestore._format.names import COMMIT_KEY
from pytreestore.backends import Backend, Snapshots


def generation_of(engine: Snapshots, version: int) -> int | None:
    """The storage generation that committed store version ``version``: the first whose
    commit record names it; None when none does (a version committed before the store was
    moved to this backend, whose rows the version record alone then pins)."""
    latest = engine.latest_generation()
    low, high = 1, latest + 1
    while low < high:  # the first generation whose commit record is at least `version`
        middle = (low + high) // 2
        if _committed(engine, middle) >= version:
            high = middle
        else:
            low = middle + 1
    return low if low <= latest and _committed(engine, low) == version else None


def _committed(engine: Snapshots, generation: int) -> int:
    """The version the commit record of ``generation`` names (-1: none yet)."""
    raw = engine.at_generation(generation).read_bytes(COMMIT_KEY)
    return -1 if raw is None else Commit.from_bytes(raw, f"generation {generation}").generation


def pinned(engine: Backend, commit: Commit) -> Backend:
    """A read-only backend holding exactly ``commit``'s rows where ``engine`` keeps every
    generation (:class:`~pytreestore.backends.Snapshots`), else ``engine`` itself."""
    if not isinstance(engine, Snapshots):
        return engine
    generation = generation_of(engine, commit.generation)
    return engine if generation is None else engine.at_generation(generation)


__all__ = ["generation_of", "pinned"]
