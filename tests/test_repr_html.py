"""The notebook view (``TreeStore._repr_html_``, pytreestore/_inspect/notebook.py and glance.py):
its facts and values on every kind of store and backend, and how it looks and folds in a real
headless Chromium (tests/browser.py), light and dark."""

from __future__ import annotations

import ast
import html.parser
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

import pytreestore
from pytreestore._format.keys import chunk_key
from pytreestore._inspect import glance as _glance
from pytreestore._inspect import notebook as _notebook
from pytreestore._inspect import repr as _repr
from tests import browser, notebook_store, trees
from tests.parity import kinds


class _Rows(html.parser.HTMLParser):
    """The view's rows: ``rows[keypath]`` is a leaf's cells (its keypath from the name's
    title); ``kv[key]`` a section's ``key: value`` row; ``head`` the column headers."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self.kv: dict[str, str] = {}
        self.head: list[str] = []
        self._row: list[str] | None = None
        self._kind = ""
        self._title: str | None = None
        self._depth = 0
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        got = dict(attrs)
        classes = (got.get("class") or "").split()
        if "pts-row" in classes:
            self._row, self._kind, self._title = [], " ".join(classes), None
        elif tag == "span" and self._row is not None:
            self._depth += 1
            if self._depth == 1:
                self._row.append("")
                if "pts-name" in classes:
                    self._title = got.get("title")

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._row is not None:
            self._depth -= 1
        elif tag in ("div", "summary") and self._row is not None and self._depth == 0:
            row, self._row = self._row, None
            if "pts-head" in self._kind:
                self.head = row
            elif "pts-kv" in self._kind:
                self.kv[row[0]] = row[1]
            elif self._title is not None:
                self.rows[self._title] = row

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._row:
            self._row[-1] += data


def _numbers(text: str) -> np.ndarray:
    """The numbers of a cell's text (``[[0.5, 1.], [2., 3.]]``), in order."""
    return np.array([float(x) for x in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", text)])


def _flat(value: Any) -> np.ndarray:
    leaves = jax.tree.leaves(value)
    if not leaves:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in leaves])


def _walk(record: Any, path: str, lists: set[str]) -> Iterator[tuple[str, Any]]:
    """``(column keypath, the record's values there)`` (a ragged list's elements' together)."""
    if isinstance(record, list) and path in lists:
        for element in record:
            yield from _walk(element, path + "[*]", lists)
        return
    flat, sub = jax.tree_util.tree_flatten_with_path(record, is_leaf=lambda x: x is not record)
    if sub.num_leaves == 1 and sub.num_nodes == 1:
        yield path, record
        return
    for (entry, *_), child in flat:
        yield from _walk(child, path + jax.tree_util.keystr((entry,)), lists)


@pytest.mark.parametrize("kind", kinds.KINDS)
def test_every_kind_shows_its_columns_and_first_and_last_values(
    tmp_path: Path, kind: str, backend: str
) -> None:
    records = kinds.filled(tmp_path / "s", kind, backend, n=9)
    store = pytreestore.open(tmp_path / "s")
    page = store._repr_html_()
    assert page is not None
    view = _Rows(page)
    columns = len(store.schema.columns)
    assert f"columns={columns}," in repr(store)  # the header agrees with repr (issue 33)
    assert f"9 records &#183; {columns} columns &#183; format 3 &#183; version " in page
    assert view.head == ["keypath", "dtype", "shape", "chunks", "bytes", "record 0", "record 8"]
    assert set(view.rows) == {c.path for c in store.schema.columns}
    lists = {a.path for a in store.schema.tables.axes}
    for index, cell in ((0, 5), (8, 6)):
        got: dict[str, list[Any]] = {}
        for path, value in _walk(records[index], "", lists):
            got.setdefault(path, []).append(value)
        for column in store.schema.columns:
            text = view.rows[column.path][cell]
            want = _flat(got.get(column.path, []))
            cut, summarised = text.endswith("…"), "..." in text
            shown = _numbers(text.rstrip("…"))[: -1 if cut else None]
            shown = shown[:3] if summarised else shown  # numpy's summary: the first edge items
            np.testing.assert_allclose(shown, want[: shown.size], atol=6e-5, err_msg=text)
            assert shown.size == want.size or cut or summarised, text
    t = view.rows[".t"]
    assert t[1:3] == ["int32", "()"] and (t[5], t[6]) == ("0", "8")
    assert t[4] == "36 B"  # 9 records x 4 bytes: no chunk measured


@pytest.mark.parametrize("kind", ["ragged_list", "ragged_axis", "optional", "nested"])
def test_ragged_axes_and_absent_parts(tmp_path: Path, kind: str) -> None:
    records = kinds.filled(tmp_path / "s", kind, "tensorstore", n=9)
    store = pytreestore.open(tmp_path / "s")
    view = _Rows(store._repr_html_() or "")
    for axis, lengths in store.lengths().items():
        low, high = int(lengths.min()), int(lengths.max())
        rows = store.commit_now().rows(axis)
        span = f"{low} to {high}" if low != high else str(low)
        assert view.kv[axis + "[*]"] == f"{span} per record · {rows:,} in all"
    if kind == "ragged_axis":
        assert view.rows[".trail"][2] == "(*, 2)"
    if kind == "optional":
        for index, cell in ((0, 5), (8, 6)):
            absent = records[index].storm is None
            assert (view.rows[".storm.cells"][cell] == "None") == absent
    if kind == "ragged_list":
        empty = [i for i in (0, 8) if not records[i].agents]
        for i in empty:
            assert view.rows[".agents[*].pos"][5 if i == 0 else 6] == "[]"
    if kind == "nested":
        events = [[int(e) for e in a.events] for a in records[0].agents]
        assert ast.literal_eval(view.rows[".agents[*].events[*]"][5]) == events


def test_an_empty_store_and_a_closed_one(tmp_path: Path, backend: str) -> None:
    store = kinds.create(tmp_path / "s", "nested", backend)
    store.flush()
    page = store._repr_html_()
    assert page is not None and "no records" in page
    view = _Rows(page)
    assert view.head == ["keypath", "dtype", "shape", "chunks", "bytes"]
    assert view.kv[".agents[*]"] == "no records · 0 in all"
    assert view.kv["version"] == "version 0 · 1 kept"
    store.close()
    assert store._repr_html_() is None  # a notebook then shows the repr


def test_a_store_opened_at_a_version_shows_that_version(tmp_path: Path, backend: str) -> None:
    with pytreestore.create(tmp_path / "s", {"x": np.int64(0)}, backend=backend) as store:
        store.extend({"x": np.int64(i)} for i in range(5))
        store.flush()
        store.tag("five")
        store.extend({"x": np.int64(i)} for i in range(5, 7))
    old = pytreestore.open(tmp_path / "s", version="five")
    view = _Rows(old._repr_html_() or "")
    assert view.head[5:] == ["record 0", "record 4"]
    assert view.rows["['x']"][5:] == ["0", "4"]
    assert view.kv["version"] == f"version 1 · {len(old.versions())} kept"
    tagged = [f"{t} (version {v.version})" for v in old.versions() for t in v.tags]
    assert view.kv.get("tags") == (", ".join(tagged) or None)  # OCDBT: as at version 1, none
    assert backend == "ocdbt" or tagged == ["five (version 1)"]
    assert _Rows(pytreestore.open(tmp_path / "s")._repr_html_() or "").rows["['x']"][6] == "6"


def test_a_writer_with_buffered_records_is_shown_without_a_commit(tmp_path: Path) -> None:
    store = pytreestore.create(tmp_path / "s", {"x": np.float32(0)})
    store.extend({"x": np.float32(i)} for i in range(3))
    versions = len(store.versions())
    page = store._repr_html_()
    assert page is not None and "3 records buffered: values are shown once committed" in page
    assert store.committed == 0 and len(store.versions()) == versions  # nothing written
    store.flush()
    assert _Rows(store._repr_html_() or "").rows["['x']"][5:] == ["0.", "2."]
    store.close()
    with kinds.create(tmp_path / "r", "nested", "tensorstore") as ragged:
        ragged.extend(kinds.records("nested", 3))
        ragged.flush()
        ragged.extend(kinds.records("nested", 2, start=3))
        view = _Rows(ragged._repr_html_() or "")
        assert ragged.committed == 3 and len(ragged) == 5
        assert view.kv[".agents[*]"] == "buffered records: lengths are shown once committed"


def test_a_long_ragged_list_shows_its_first_elements(tmp_path: Path) -> None:
    record = {"p": [np.int32(k) for k in range(40)]}
    with pytreestore.create(tmp_path / "s", record, ragged=["['p']"]) as store:
        store.append(record)
        store.append({"p": [np.int32(k) for k in range(3)]})
    page = pytreestore.open(tmp_path / "s")._repr_html_() or ""
    first = "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ...]"
    cells = _Rows(page).rows["['p'][*]"][5:]
    assert cells == [first[: _glance.CELL_WIDTH - 1] + "…", "[0, 1, 2]"]
    assert f"title='{first}'" in page  # the tooltip: the value in full


def test_a_root_leaf_a_constant_and_packed_leaves(tmp_path: Path, backend: str) -> None:
    with pytreestore.create(tmp_path / "r", np.zeros(3, np.float32), backend=backend) as store:
        store.extend(np.full(3, i, np.float32) for i in range(3))
    view = _Rows(pytreestore.open(tmp_path / "r")._repr_html_() or "")
    assert view.rows["(the root leaf)"][1:] == [
        *("float32", "(3,)", "(65536, 3)", "36 B"),
        *("[0., 0., 0.]", "[2., 2., 2.]"),
    ]
    record = {"f": jax.nn.relu, "a": np.int16(0), "b": np.zeros(2, np.float32), "c": np.int16(0)}
    with pytreestore.create(tmp_path / "p", record, pack=True, backend=backend) as store:
        store.extend(
            {**record, "a": np.int16(i), "b": np.full(2, i / 2, np.float32)} for i in range(4)
        )
    page = pytreestore.open(tmp_path / "p")._repr_html_() or ""
    view = _Rows(page)
    assert view.rows["['a']"][5:] == ["0", "3"]
    assert view.rows["['b']"][5:] == ["[0., 0.]", "[1.5, 1.5]"]
    assert "relu (constant)" in page
    assert [k for k in view.kv if k.startswith("_pack_")] == ["_pack_int16_0"]


def test_user_data_is_escaped(tmp_path: Path) -> None:
    bad = "<script>alert(1)</script>"
    record = {bad: trees.WithStatic(np.float32(1), name=bad)}
    with pytreestore.create(tmp_path / "s", record) as store:
        store.append(record)
    page = pytreestore.open(tmp_path / "s")._repr_html_() or ""
    assert "<script" not in page and page.count("&lt;script&gt;") >= 3  # key, title, static
    view = _Rows(page)
    assert view.kv[f"['{bad}'].name"] == repr(bad)
    assert view.rows[f"['{bad}'].value"][5] == "1."


def test_a_read_error_shows_in_the_cells(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"a": np.arange(4.0), "b": np.int8(0)}) as store:
        store.extend({"a": np.arange(4.0) + i, "b": np.int8(i)} for i in range(3))
    (tmp_path / "s" / chunk_key("a", (0, 0))).write_bytes(b"not a zstd frame")
    store = pytreestore.open(tmp_path / "s")
    with pytest.raises(Exception) as raised:  # whatever the backend raises
        store.load(0)
    page = store._repr_html_()
    assert page is not None
    message = _glance.one_line(raised.value)
    cells = _Rows(page).rows["['a']"][5:]
    assert cells[0] == message[: _glance.CELL_WIDTH - 1] + "…" and cells[0] == cells[1]
    assert "pts-error" in page and "3 records" in page


def test_a_wide_tree_starts_folded(tmp_path: Path) -> None:
    wide = {f"layer{i:02d}": {"w": np.zeros(2, np.float32), "b": np.float32(0)} for i in range(30)}
    with pytreestore.create(tmp_path / "s", wide) as store:
        store.append(wide)
    page = pytreestore.open(tmp_path / "s")._repr_html_() or ""
    assert page.count("<details class='pts-node' open>") == 1  # the root
    assert page.count("<details class='pts-node'>") == 30  # each layer folded
    narrow = kinds.filled(tmp_path / "n", "nested", "tensorstore", n=2)
    assert narrow and "<details class='pts-node'>" not in (
        pytreestore.open(tmp_path / "n")._repr_html_() or ""
    )


def test_the_view_measures_no_chunk(tmp_path: Path) -> None:
    with pytreestore.create(tmp_path / "s", {"x": np.float32(0)}, chunk_records=2) as store:
        store.extend({"x": np.float32(i)} for i in range(8))
    store = pytreestore.open(tmp_path / "s")
    quick = _repr.describe(store, measure=False)
    assert (quick.stored, quick.disk_bytes, quick.nbytes) == (None, None, 32)
    assert _repr.describe(store).stored is not None  # pytreestore info still measures
    page = store._repr_html_() or ""
    assert "data 32 B" in page and "stored" not in page


def test_the_text_fallback_is_the_repr(tmp_path: Path) -> None:
    store = notebook_store.example(tmp_path / "s")
    page = store._repr_html_() or ""
    fallback = re.search("<pre class='pts-fallback'>(.*?)</pre>", page)
    assert fallback is not None and html.unescape(fallback.group(1)) == repr(store)
    assert page.isascii()  # non-ASCII as character references: any page charset works
    assert len(store.schema.columns) < _notebook.FOLD_AT


# ---- in a real browser ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def page() -> Iterator[browser.Page]:
    executable = browser.executable()
    if executable is None:
        pytest.skip(f"Chromium is not fetched: run `{browser.FETCH}` (make test does)")
    pytest.importorskip("websockets", reason="the DevTools client needs websockets")
    with browser.chromium(executable) as opened:
        yield opened


def test_the_view_in_chromium_light_and_dark(page: browser.Page, tmp_path: Path) -> None:
    view = notebook_store.example_view(tmp_path)
    backgrounds = []
    for dark in (False, True):
        page.show(view, dark=dark)
        text = page.evaluate("document.body.innerText")
        for want in (".particles", "list[*]", "[*]", ".pos", "float32", "uint8", "(*,)"):
            assert want in text
        assert "record 0" in text and "record 11" in text
        assert "[[11, 12, 13, 14], [15, 16" in text  # the last record's .image
        assert "0 to 3 per record · 18 in all" in text  # .particles[*]
        assert "first-ten (version 1)" in text and ".run" in text and "'run-a'" in text
        assert not page.visible(".pts-fallback")
        backgrounds.append(page.evaluate("getComputedStyle(document.querySelector('.pts-wrap'))"
                                         ".backgroundColor"))  # fmt: skip
        png = page.screenshot()
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
        (tmp_path / f"{'dark' if dark else 'light'}.png").write_bytes(png)
    assert backgrounds == ["rgb(255, 255, 255)", "rgb(13, 17, 23)"]


def test_sections_and_subtrees_fold_on_click(page: browser.Page, tmp_path: Path) -> None:
    page.show(notebook_store.example_view(tmp_path))
    index = "details.pts-section:not([open]) .pts-kv"  # the index arrays, folded at first
    assert page.evaluate(f"document.querySelectorAll({index!r}).length") == 3
    first = "#arrays .pts-kv"
    page.evaluate(
        f"document.querySelector({index!r}).closest('details').id = 'arrays'"
    )  # fmt: skip
    assert not page.visible(first)
    page.click("#arrays > summary")
    assert page.visible(first)
    pos = "[title='.particles[*].pos']"
    node = f"details.pts-node:has(> details.pts-node > div > {pos})"  # .particles
    assert page.visible(pos)
    page.click(f"{node} > summary")
    assert not page.visible(pos) and page.visible("[title='.step']")
    page.click(f"{node} > summary")
    assert page.visible(pos)


def test_a_stripped_style_shows_the_text_fallback(page: browser.Page, tmp_path: Path) -> None:
    view = re.sub("<style>.*?</style>", "", notebook_store.example_view(tmp_path), flags=re.S)
    page.show(view)
    assert page.visible(".pts-fallback") and not page.visible(".pts-wrap")
    assert page.evaluate("document.body.innerText").startswith("TreeStore(")
