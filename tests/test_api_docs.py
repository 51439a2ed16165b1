"""The API reference (docs/api.md, built by mkdocstrings) shows the whole public API and nothing else.

The site is built once, strictly, into a temporary directory (about 4 s), and the anchors of
the rendered page are read back: mkdocstrings gives each rendered object a heading whose
``id`` is its full dotted path (``id="pytreestore.TreeStore.load"``). Every public name of
``pytreestore``, ``pytreestore.errors``, ``pytreestore.ray`` and ``pytreestore.testing`` and
every public method and property of ``TreeStore`` (those its faces give it included) must have
one; no private name, and none of the two methods pytreestore's own modules read a store
through (``_store.py``, "the seam"), may. The page's text names no private module.

The build needs the ``docs`` extra (mkdocs, mkdocstrings); without it these tests skip, and
``make docs`` (which CI runs, ``.ci/run``) installs the extra and runs them.
"""

from __future__ import annotations

import ast
import html.parser
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pytreestore
from pytreestore import errors

pytest.importorskip("mkdocs", reason="the docs extra is not installed")
pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra is not installed")

ROOT = Path(__file__).resolve().parent.parent

#: TreeStore methods that pytreestore's own modules call and users do not (pytreestore/_store.py)
SEAM = {"read_context", "commit_now"}


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(v for k, v in attrs if k == "id" and v and v.startswith("pytreestore"))


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> tuple[set[str], str]:
    """The ids of the built API page and its text (tags stripped)."""
    site = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (site / "api" / "index.html").read_text()
    parser = _Ids()
    parser.feed(text)
    return parser.ids, html.unescape(re.sub(r"<[^>]+>", "", text))


def _all_of(module_file: Path) -> list[str]:
    """A module's ``__all__``, read without importing it (pytreestore.ray needs Ray)."""
    for node in ast.parse(module_file.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module_file} has no __all__")


def _missing(ids: set[str], module: str, names: list[str]) -> list[str]:
    return [n for n in names if f"{module}.{n}" not in ids]


def test_every_public_name_has_an_entry(page):
    ids, _ = page
    assert len(pytreestore.__all__) > 15
    assert _missing(ids, "pytreestore", pytreestore.__all__) == []
    assert _missing(ids, "pytreestore.errors", errors.__all__) == []
    ray = _all_of(ROOT / "pytreestore" / "ray.py")
    assert "TreeStoreDatasink" in ray
    assert _missing(ids, "pytreestore.ray", ray) == []
    testing = _all_of(ROOT / "pytreestore" / "testing" / "__init__.py")
    assert _missing(ids, "pytreestore.testing", testing) == []


def _tree_store_members(ids: set[str]) -> set[str]:
    prefix = "pytreestore.TreeStore."
    return {i[len(prefix) :] for i in ids if i.startswith(prefix)}


def test_the_tree_store_entry_shows_its_public_members_and_only_them(page):
    ids, _ = page
    public = {n for n in dir(pytreestore.TreeStore) if not n.startswith("_")}
    # the read API, which the store's faces (_faces.py, _pipelines, ...) give it
    inherited = {"load", "batches", "map", "records", "lengths", "grain_source", "versions"}
    inherited |= {"tag", "truncate", "vacuum", "commit_fragments", "version"}
    assert inherited <= public
    assert public >= SEAM
    assert _tree_store_members(ids) == public - SEAM


def test_no_private_name_is_shown(page):
    ids, text = page
    private = [i for i in ids if any(p[:1] == "_" and p[:2] != "__" for p in i.split("."))]
    assert private == []
    assert {i for i in ids if i.startswith("pytreestore.__")} == {"pytreestore.__version__"}
    assert sorted(set(re.findall(r"pytreestore\._[a-z]\w*(?:\.\w+)*", text))) == []


def test_the_seam_stays_hidden_by_name(page):
    """The filter in docs/api.md names the seam; a method added to it must be named there too."""
    ids, _ = page
    assert not {f"pytreestore.TreeStore.{n}" for n in SEAM} & ids
    api = (ROOT / "docs" / "api.md").read_text()
    hidden = set(re.findall(r'"!\^(\w+)\$"', api))
    assert hidden == SEAM
