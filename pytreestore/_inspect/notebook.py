"""The style sheet of the notebook view (:mod:`pytreestore._inspect.notebook`).

Its colours follow the notebook's theme: JupyterLab's ``--jp-*`` variables and VS Code's
``--vscode-*`` ones where the page defines them, else light or dark by the browser's
``prefers-color-scheme`` (or a dark theme's class on the page). Every class starts with
``pts-``. The view is hidden by an inline ``display:none`` that this sheet overrides, so that
where a notebook strips the style the plain-text fallback shows instead (xarray's way).

The notebook view of a store (``TreeStore._repr_html_``), in the manner of xarray's.

A title (path, records, columns, format, version, chunking, codec, bytes), then sections that
fold without JavaScript (``<details>``): the column tree, one foldable block per subtree, each
leaf with its dtype, shape, chunks and bytes and the first and last records' values; the
static fields; the ragged axes with their lengths' range; the arrays that index the tables;
the versions and tags. A tree of more than :data:`FOLD_AT` rows starts with its subtrees
folded. Sizes are the records' bytes, uncompressed (shape x dtype x rows, from the commit
record): no chunk is listed or measured (``pytreestore info`` measures them). Everything
shown is escaped (keypaths and static values are user data). Where a notebook strips the
style sheet, the plain ``repr`` shows instead.

Example:
    >>> import numpy as np, pytreestore
    >>> s = pytreestore.create("memory://doc-notebook", {"a": np.zeros(2, np.int8)})
    >>> s.extend({"a": np.full(2, i, np.int8)} for i in range(3)); s.flush()
    >>> page = html_of(s)
    >>> "<details class='pts-section' open>" in page, "[2, 2]" in page
    (True, True)
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Protocol

from pytreestore._inspect.glance import (
    CELL_WIDTH,
    TITLE_WIDTH,
    Glance,
    Glanced,
    Sample,
    TreeRow,
    glance,
    samples_header,
    tree_rows,
)
from pytreestore._inspect.printed import static_text
from pytreestore._inspect.repr import (
    ColumnInfo,
    Described,
    StoreInfo,
    describe,
    format_bytes,
    summary,
)
from pytreestore.errors import PyTreeStoreError

_LIGHT = """
  --pts-fg: var(--jp-content-font-color0, var(--vscode-editor-foreground, #1f2328));
  --pts-muted: var(--jp-content-font-color2, var(--vscode-descriptionForeground, #656d76));
  --pts-border: var(--jp-border-color2, var(--vscode-panel-border, #d0d7de));
  --pts-bg: var(--jp-layout-color0, var(--vscode-editor-background, #ffffff));
  --pts-head: var(--jp-layout-color2, var(--vscode-editorWidget-background, #f0f2f4));
  --pts-hover: var(--jp-layout-color1, var(--vscode-list-hoverBackground, #f6f8fa));
  --pts-accent: var(--jp-brand-color1, var(--vscode-textLink-foreground, #0969da));
"""


_DARK = """
  --pts-fg: var(--jp-content-font-color0, var(--vscode-editor-foreground, #e6edf3));
  --pts-muted: var(--jp-content-font-color2, var(--vscode-descriptionForeground, #9198a1));
  --pts-border: var(--jp-border-color2, var(--vscode-panel-border, #3d444d));
  --pts-bg: var(--jp-layout-color0, var(--vscode-editor-background, #0d1117));
  --pts-head: var(--jp-layout-color2, var(--vscode-editorWidget-background, #1f252d));
  --pts-hover: var(--jp-layout-color1, var(--vscode-list-hoverBackground, #161b22));
  --pts-accent: var(--jp-brand-color1, var(--vscode-textLink-foreground, #4493f8));
"""


#: the values columns' widths by how many records are shown (0, 1 or 2)
_GRIDS = {
    0: "minmax(16em, 2fr) 5.5em 6em 8em 5.5em",
    1: "minmax(16em, 2fr) 5.5em 6em 8em 5.5em minmax(10em, 3fr)",
    2: "minmax(16em, 2fr) 5.5em 6em 8em 5.5em minmax(10em, 3fr) minmax(10em, 3fr)",
}


CSS = (
    f".pts-root {{{_LIGHT}}}\n"
    f"@media (prefers-color-scheme: dark) {{ .pts-root {{{_DARK}}} }}\n"
    "html[theme='dark'] .pts-root, html[data-theme='dark'] .pts-root,"
    f" body[data-jp-theme-light='false'] .pts-root, body.vscode-dark .pts-root {{{_DARK}}}\n"
    "body.vscode-light .pts-root, body[data-jp-theme-light='true'] .pts-root,"
    f" html[data-theme='light'] .pts-root {{{_LIGHT}}}\n"
    + """
.pts-fallback { display: none; }
.pts-wrap { display: block !important; color: var(--pts-fg); background: var(--pts-bg);
  font-family: var(--jp-ui-font-family, -apple-system, 'Segoe UI', Roboto, sans-serif);
  font-size: 13px; line-height: 1.5; max-width: 1200px; padding: 4px 0; }
.pts-title { border-bottom: 1px solid var(--pts-border); padding: 2px 4px 6px; }
.pts-title b { color: var(--pts-accent); margin-right: 0.6em; }
.pts-path { font-family: var(--jp-code-font-family, monospace); }
.pts-facts { color: var(--pts-muted); }
.pts-section { border-bottom: 1px solid var(--pts-border); }
.pts-section > summary { cursor: pointer; padding: 3px 4px; font-weight: 600;
  list-style: none; }
.pts-section > summary::-webkit-details-marker, .pts-node > summary::-webkit-details-marker
  { display: none; }
.pts-section > summary::before { content: '\\25B8'; display: inline-block; width: 1.1em;
  color: var(--pts-muted); }
.pts-section[open] > summary::before { content: '\\25BE'; }
.pts-count, .pts-note { color: var(--pts-muted); font-weight: normal; margin-left: 0.4em; }
.pts-body { padding: 0 0 6px 0; overflow-x: auto; }
.pts-row { display: grid; column-gap: 0.8em; padding: 0 4px; align-items: baseline;
  font-family: var(--jp-code-font-family, monospace); font-size: 12px; }
.pts-row > span { overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.pts-row:hover { background: var(--pts-hover); }
.pts-head { background: var(--pts-head); color: var(--pts-muted); font-weight: 600; }
.pts-node > summary { list-style: none; cursor: pointer; }
.pts-name { padding-left: calc(var(--pts-depth, 0) * 1.3em); }
.pts-name::before { content: ''; display: inline-block; width: 1.1em; }
.pts-node > summary > .pts-name::before { content: '\\25B8'; color: var(--pts-muted); }
.pts-node[open] > summary > .pts-name::before { content: '\\25BE'; }
.pts-kind { color: var(--pts-muted); margin-left: 0.6em; }
.pts-num { text-align: right; }
.pts-value { color: var(--pts-fg); }
.pts-error { color: #cf222e; }
.pts-kv { grid-template-columns: minmax(14em, 1fr) 3fr; }
"""
    + "\n".join(
        f".pts-v{n} .pts-row:not(.pts-kv) {{ grid-template-columns: {grid}; }}"
        for n, grid in _GRIDS.items()
    )
)


#: a column tree of more rows than this starts with its subtrees folded (the root open)
FOLD_AT = 30


#: static fields shown open, at most (more start folded)
STATIC_OPEN = 10


class Viewed(Described, Glanced, Protocol):
    """What the notebook view needs of a store (a :class:`pytreestore.TreeStore` has it)."""


def html_of(store: Viewed) -> str | None:
    """``store`` as a notebook shows it, or None (the plain repr) if it is closed or its
    schema cannot be parsed (the repr says why)."""
    if store.closed:
        return None
    try:
        tree, info = store.schema.tree, describe(store, measure=False)
    except PyTreeStoreError:
        return None
    return render(info, tree, glance(store), summary(store))


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def render(info: StoreInfo, tree: dict[str, object], seen: Glance, fallback: str) -> str:
    """The notebook view of a store described by ``info`` (its schema's JSON ``tree``) and
    ``seen``; ``fallback`` is the text shown where the style sheet is stripped."""
    sections = [_columns(info, tree, seen)]
    if info.static:
        rows = [
            _kv(f.keypath, static_text(f.value), title=static_text(f.value)) for f in info.static
        ]
        sections.append(_section("Static fields", len(rows), rows, len(rows) <= STATIC_OPEN))
    if seen.axes:
        axes = [_kv(a.path + "[*]", a.text) for a in seen.axes]
        sections.append(_section("Ragged axes", len(axes), axes, True))
    arrays = [c for c in info.columns if c.role is not None]
    if arrays:
        sections.append(_section("Index arrays", len(arrays), _arrays(arrays), False))
    sections.append(_versions(seen))
    page = (
        f"<div class='pts-root'><style>{CSS}</style>"
        f"<pre class='pts-fallback'>{_esc(fallback)}</pre>"
        f"<div class='pts-wrap' style='display:none'>{_title(info, seen)}{''.join(sections)}"
        "</div></div>"
    )
    return page.encode("ascii", "xmlcharrefreplace").decode()  # whatever the page's charset


def _title(info: StoreInfo, seen: Glance) -> str:
    facts = [
        f"{info.records:,} records",
        f"{len(info.leaves)} columns",
        f"format {info.format_version}",
        *([] if seen.versions.error else [f"version {seen.versions.version}"]),
        f"{info.chunk_records:,} records per chunk",
        info.codec or "uncompressed",
        f"data {format_bytes(info.nbytes)}",
    ]
    return (
        f"<div class='pts-title'><b>TreeStore</b><span class='pts-path'>{_esc(info.path)}"
        f"</span><br><span class='pts-facts'>{_esc(' · '.join(facts))}</span></div>"
    )


def _section(
    name: str, count: int | None, rows: Sequence[str], is_open: bool, note: str = ""
) -> str:
    shown = "" if count is None else f"<span class='pts-count'>({count:,})</span>"
    extra = f"<span class='pts-note'>{_esc(note)}</span>" if note else ""
    return (
        f"<details class='pts-section'{' open' if is_open else ''}><summary>{_esc(name)}"
        f"{shown}{extra}</summary><div class='pts-body'>{''.join(rows)}</div></details>"
    )


def _kv(key: str, value: str, title: str | None = None) -> str:
    tip = f" title='{_esc(_clip(title))}'" if title else ""
    return (
        f"<div class='pts-row pts-kv'><span>{_esc(key)}</span>"
        f"<span class='pts-value'{tip}>{_esc(_clip(value))}</span></div>"
    )


def _clip(text: str) -> str:
    return text if len(text) <= TITLE_WIDTH else text[: TITLE_WIDTH - 1] + "…"


def _columns(info: StoreInfo, tree: dict[str, object], seen: Glance) -> str:
    rows = tree_rows(tree, info.axes, info.optional)
    head = ["keypath", "dtype", "shape", "chunks", "bytes", *samples_header(seen.samples)]
    header = "<div class='pts-row pts-head'>" + "".join(
        f"<span{' class=pts-num' if i == 4 else ''}>{_esc(h)}</span>" for i, h in enumerate(head)
    )
    body = _tree(rows, info, seen.samples, folded=len(rows) > FOLD_AT)
    section = _section(
        "Columns", len(info.leaves), [header + "</div>", body], True, seen.note or ""
    )
    return f"<div class='pts-v{len(seen.samples)}'>{section}</div>"


def _tree(rows: Sequence[TreeRow], info: StoreInfo, samples: Sequence[Sample], folded: bool) -> str:
    """The rows, each subtree in a ``<details>`` holding its node's row as its summary."""
    depths = [len(r.prefix) // 4 for r in rows]
    out: list[str] = []
    open_at: list[int] = []
    for i, (row, depth) in enumerate(zip(rows, depths)):
        while open_at and open_at[-1] >= depth:
            out.append("</details>")
            open_at.pop()
        cells = _cells(row, depth, info, samples)
        if i + 1 < len(rows) and depths[i + 1] > depth:
            shown = " open" if depth == 0 or not folded else ""
            out.append(
                f"<details class='pts-node'{shown}><summary class='pts-row'>{cells}</summary>"
            )
            open_at.append(depth)
        else:
            out.append(f"<div class='pts-row'>{cells}</div>")
    out.extend("</details>" for _ in open_at)
    return "".join(out)


def _cells(row: TreeRow, depth: int, info: StoreInfo, samples: Sequence[Sample]) -> str:
    entry, _, kind = row.label.partition("  ")
    column = info.columns[row.column] if row.column is not None else None
    title = f" title='{_esc(column.path or '(the root leaf)')}'" if column is not None else ""
    name = (
        f"<span class='pts-name' style='--pts-depth:{depth}'{title}>{_esc(entry)}"
        + (f"<span class='pts-kind'>{_esc(kind.strip())}</span>" if kind else "")
        + "</span>"
    )
    if column is None:
        return name + "<span></span>" * (4 + len(samples))
    return name + _leaf_cells(column) + "".join(_value(s, column.path) for s in samples)


def _leaf_cells(c: ColumnInfo) -> str:
    shape = ("*", *c.shape) if c.leading else c.shape
    return (
        f"<span>{_esc(c.dtype)}</span><span>{_esc(_shape(shape))}</span>"
        f"<span>{_esc(_shape(c.chunks))}</span>"
        f"<span class='pts-num'>{_esc(format_bytes(c.nbytes))}</span>"
    )


def _value(sample: Sample, path: str) -> str:
    kind = "pts-error" if sample.error is not None else "pts-value"
    full = sample.text(path, TITLE_WIDTH)
    return f"<span class='{kind}' title='{_esc(full)}'>{_esc(sample.text(path, CELL_WIDTH))}</span>"


def _shape(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _arrays(arrays: Sequence[ColumnInfo]) -> list[str]:
    out = []
    for c in arrays:
        what = {"offsets": f"offsets of {c.path}", "presence": f"presence of {c.path}"}
        table = "the record table" if c.table is None else f"the table of {c.table}"
        label = f"{what.get(c.role or '', 'pack')}, in {table}"
        out.append(_kv(c.key, f"{c.dtype} · {format_bytes(c.nbytes)} · {label}"))
    return out


def _versions(seen: Glance) -> str:
    facts = seen.versions
    rows = [_kv("version", facts.text)]
    if facts.tags:
        rows.append(_kv("tags", ", ".join(f"{name} (version {n})" for name, n in facts.tags)))
    return _section("Versions", None, rows, True)


__all__ = ["CSS", "FOLD_AT", "Viewed", "html_of", "render"]
