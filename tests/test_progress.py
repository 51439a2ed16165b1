"""Progress bars: records done and MB/s, on standard error, only when asked."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import pytreestore
from pytreestore._inspect import progress as _progress
from pytreestore.errors import SchemaMismatchError


def test_bar_counts_records_and_megabytes_per_second() -> None:
    out = io.StringIO()
    with _progress.progress_bar(total=1000, desc="copy", record_nbytes=1000, file=out) as bar:
        bar.advance(400)
        bar.advance(600)
    assert bar.records == 1000
    final = out.getvalue().split("\r")[-1]
    assert final.startswith("copy: 100%")
    assert "1000/1000" in final and " records/s" in final and " MB/s" in final


def test_a_disabled_bar_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with _progress.progress_bar(total=3, desc="copy", record_nbytes=8, enabled=False) as bar:
        bar.advance(3)
    assert bar.records == 3
    assert capsys.readouterr() == ("", "")


def test_track_yields_everything_and_takes_the_total_from_len() -> None:
    out = io.StringIO()
    items = list(range(1000))
    assert list(_progress.track(items, desc="t", record_nbytes=4, file=out)) == items
    assert "1000/1000" in out.getvalue().split("\r")[-1]
    unsized = io.StringIO()
    assert sum(_progress.track(iter(items), desc="t", record_nbytes=4, file=unsized)) == 499500
    assert "1000 records" in unsized.getvalue().split("\r")[-1]  # no total: a count


def test_default_is_a_bar_only_on_a_terminal() -> None:
    assert _progress.default_enabled(io.StringIO()) is False

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert _progress.default_enabled(Terminal()) is True


def test_extend_with_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytreestore.create(tmp_path / "s", {"v": np.zeros(4, np.float32)}) as store:
        store.extend(({"v": np.full(4, i, np.float32)} for i in range(600)), progress=True)
        err = capsys.readouterr().err
        assert err.split("\r")[-1].startswith("extend: 600 records")
        assert "MB/s" in err
        store.extend([{"v": np.ones(4, np.float32)}] * 10)
        assert capsys.readouterr().err == ""
        assert len(store) == 610


def test_extend_with_progress_still_appends_all_or_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytreestore.create(tmp_path / "s", {"v": np.float32(0)}, chunk_records=4) as store:
        records = [{"v": np.float32(i)} for i in range(9)] + [{"v": "oops"}]
        with pytest.raises(SchemaMismatchError, match="extend\\(\\) refused record 9"):
            store.extend(records, progress=True)
        assert len(store) == 0
        assert "extend:" in capsys.readouterr().err


def test_copy_with_progress(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytreestore.create(tmp_path / "s", {"v": np.float32(0)}, chunk_records=4) as store:
        store.extend({"v": np.float32(i)} for i in range(10))
    assert pytreestore.copy(tmp_path / "s", tmp_path / "c", progress=True) == 10
    last = capsys.readouterr().err.split("\r")[-1]
    assert last.startswith("copy: 100%") and "10/10" in last
