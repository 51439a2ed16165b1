"""The style sheet of the notebook view (:mod:`pytreestore._inspect.notebook`).

Its colours follow the notebook's theme: JupyterLab's ``--jp-*`` variables and VS Code's
``--vscode-*`` ones where the page defines them, else light or dark by the browser's
``prefers-color-scheme`` (or a dark theme's class on the page). Every class starts with
``pts-``. The view is hidden by an inline ``display:none`` that this sheet overrides, so that
where a notebook strips the style the plain-text fallback shows instead (xarray's way).
"""

from __future__ import annotations

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

__all__ = ["CSS"]
