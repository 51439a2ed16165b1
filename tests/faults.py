"""Faults injected into a store's backend: a writer that dies, or a disk that fills, at the
write of one key."""

from __future__ import annotations

from typing import Any

import pytest

from pytreestore._format.keys import ROOT_KEY


def fail_root_writes(monkeypatch: pytest.MonkeyPatch, engine: Any, error: BaseException) -> None:
    """Makes every ``write_bytes`` of the root ``zarr.json`` through ``engine`` raise
    ``error`` (``monkeypatch.undo()`` ends it); every other key is written."""
    real = engine.write_bytes

    def failing(key: str, data: bytes) -> None:
        if key == ROOT_KEY:
            raise error
        return real(key, data)

    monkeypatch.setattr(engine, "write_bytes", failing)
