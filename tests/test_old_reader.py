"""A reader of the previous format refuses a store of the new one, clearly.

The reader is pytreestore as it was at the last commit of format 2, run in a subprocess; it
opens stores of format 3 written by today's code. Its source is committed as
tests/data/format2_reader.tar.gz, so the test runs on any clone, shallow or not; it was made with
``git archive --format=tar.gz fee644c6c5 pytreestore > tests/data/format2_reader.tar.gz``.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

import pytreestore

#: the last commit whose pytreestore wrote and read format 2
FORMAT_2 = "fee644c6c5c95f1b20f24006a2ffa9c52e4076f9"
READER = Path(__file__).resolve().parent / "data" / "format2_reader.tar.gz"

PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import pytreestore
assert pytreestore.FORMAT_VERSION == 2, pytreestore.FORMAT_VERSION
for path in sys.argv[2:]:
    try:
        pytreestore.open(path)
    except pytreestore.errors.FormatVersionError as err:
        print("REFUSED", err)
    else:
        print("OPENED", path)
"""


def _format_2_source(into: Path) -> Path:
    """Unpacks the format-2 reader's source under ``into``; the folder to put on sys.path."""
    with tarfile.open(READER) as tar:
        tar.extractall(into / "old", filter="data")
    return into / "old"


def test_a_format_2_reader_refuses_format_3_stores(tmp_path):
    old = _format_2_source(tmp_path)
    fixed, ragged = tmp_path / "fixed", tmp_path / "ragged"
    with pytreestore.create(fixed, {"x": np.float32(0)}) as store:
        store.extend({"x": np.float32(i)} for i in range(3))
        store.truncate(2)
    with pytreestore.create(ragged, {"p": [np.int8(0)]}, ragged=True) as store:
        store.append({"p": [np.int8(1), np.int8(2)]})
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(old), str(fixed), str(ragged)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("REFUSED") for line in lines), lines
    assert "format 3, newer than the 2" in lines[0] and "upgrade pytreestore" in lines[0]
