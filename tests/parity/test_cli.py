"""The CLI on every kind of store (issue 29's parity matrix), in a process where the writer's
classes (``tests.parity.kinds``) cannot be imported; and ``repr``/``str`` of every kind.

One child process per backend runs ``info``, ``head``, ``verify`` and ``versions`` on a store
of each kind (a cold interpreter costs seconds); each cell of the matrix is checked by its own
test. The child's ``PYTHONPATH`` is a folder holding only the package (``tests/`` beside it
would make the classes importable), and its working directory is the test's own folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pytreestore
from pytreestore._cli.commands import _plain
from pytreestore._cli.common import jsonable
from tests.parity import kinds
from tests.parity.test_copy import assert_same

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "info": ["info"],
    "info_json": ["info", "--json"],
    "head": ["head", "-n", "3"],
    "head_json": ["head", "-n", "3", "--json"],
    "verify": ["verify"],
    "versions_json": ["versions", "--json"],
    "copy": ["copy", "--pack", "on", "--backend", "zarr"],
}
CHILD = """
import json, sys
from click.testing import CliRunner
try:
    import tests.parity.kinds
except ImportError:
    importable = False
else:
    importable = True
from pytreestore.cli import main
out = {"importable": importable}
for kind in sys.argv[2:]:
    for name, args in json.loads(sys.argv[1]).items():
        paths = [kind, kind + "-copy"] if name == "copy" else [kind]
        r = CliRunner().invoke(main, [*args, *paths])
        out[kind + " " + name] = [r.exit_code, r.stdout, r.stderr]
print(json.dumps(out))
"""


def package_only(folder: Path) -> Path:
    """A folder whose only importable names are the package and its top-level modules."""
    folder.mkdir()
    for name in ("pytreestore", "pytreestore_zarr_autoload.py", "pytreestore_zarr_dtypes.py"):
        if (ROOT / name).exists():
            (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.fixture(scope="module", params=kinds.BACKENDS)
def ran(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every command's (exit code, stdout, stderr) on a store of each kind on one backend,
    run without the classes; and each kind's records."""
    backend = request.param
    where = tmp_path_factory.mktemp(f"cli-{backend}")
    records = {k: kinds.filled(where / k, k, backend) for k in kinds.KINDS}
    env = {**os.environ, "PYTHONPATH": str(package_only(where / "pkg"))}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(COMMANDS), *kinds.KINDS],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return {"out": json.loads(child.stdout), "records": records, "where": where}


def result(ran: dict, kind: str, name: str) -> str:
    code, stdout, stderr = ran["out"][f"{kind} {name}"]
    assert code == 0, f"{name} on {kind}: exit {code}\n{stderr}\n{stdout}"
    return stdout


def test_the_classes_cannot_be_imported_there(ran: dict) -> None:
    assert ran["out"]["importable"] is False


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_info(ran: dict, kind: str) -> None:
    text = result(ran, kind, "info")
    assert "  9 records · " in text
    rows = {line.split()[1]: line for line in text.splitlines() if "── " in line}
    if kind in ("ragged_list", "nested"):
        assert "list[1]" not in text and ".agents  list[*]" in text
        assert "[*]  Agent" in text
    else:
        assert ".agents  list[2]" in text and "[*]" not in text
    if kind == "nested":
        assert ".events  list[*]" in text
    trail = rows[".trail"]
    assert "(*, 2)" in trail if kind == "ragged_axis" else "(3, 2)" in trail
    assert ("(optional)" in rows[".storm"]) == (kind == "optional")
    details = json.loads(result(ran, kind, "info_json"))
    assert details["records"] == 9
    leaves = [c for c in details["columns"] if "role" not in c]
    assert [c["path"] for c in leaves] == [
        c.path for c in pytreestore.open(ran["where"] / kind).schema.columns
    ]
    trail_json = next(c for c in leaves if c["path"] == ".trail")
    assert trail_json.get("ragged_leading_axis", False) == (kind == "ragged_axis")
    axes = {"ragged_list": [".agents"], "ragged_axis": [".trail"]}
    axes["nested"] = [".agents", ".agents[*].events"]
    assert details.get("ragged_axes", []) == axes.get(kind, [])
    assert details.get("optional", []) == ([".storm"] if kind == "optional" else [])


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_head(ran: dict, kind: str) -> None:
    text = result(ran, kind, "head")
    assert text.startswith("[0] Step\n") and "... 6 more of 9 records" in text
    got = json.loads(result(ran, kind, "head_json"))
    want = [jsonable(_plain(r)) for r in ran["records"][kind][:3]]
    assert got == want


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_verify_and_versions(ran: dict, kind: str) -> None:
    assert "OK (9 records" in result(ran, kind, "verify")
    listed = json.loads(result(ran, kind, "versions_json"))
    assert listed[0]["records"] == 0 and listed[-1]["records"] == 9


@pytest.mark.parametrize("backend", kinds.BACKENDS)
@pytest.mark.parametrize("kind", kinds.KINDS)
def test_repr_and_str(tmp_path: Path, kind: str, backend: str) -> None:
    records = kinds.filled(tmp_path / "s", kind, backend)
    reader = pytreestore.open(tmp_path / "s")
    columns = len(reader.schema.columns)
    want = f"TreeStore('{tmp_path / 's'}', mode='r', records=9, columns={columns}, nbytes="
    assert repr(reader).startswith(want) and str(reader) == repr(reader)
    html = reader._repr_html_()
    assert html is not None and "pts-wrap" in html and "9 records" in html
    if kind in ("ragged_list", "nested"):
        assert "list[*]" in html
    with pytreestore.open(tmp_path / "s", mode="a") as writer:
        writer.append(kinds.record(kind, len(records)))
        assert repr(writer).startswith(
            f"TreeStore('{tmp_path / 's'}', mode='a', records=10, columns={columns}, nbytes="
        )
    assert repr(writer).endswith("closed)")


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_copy_packed_to_zarr(ran: dict, kind: str) -> None:
    """``pytreestore copy --pack on --backend zarr`` without the classes: an exact copy."""
    assert "copied 9 records" in result(ran, kind, "copy")
    copy = pytreestore.open(ran["where"] / f"{kind}-copy")
    assert copy.schema.packs != ()
    for got, want in zip(copy.records(as_numpy=True), ran["records"][kind], strict=True):
        assert_same(got, want)
