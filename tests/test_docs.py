"""Every code block of the docs runs, so the docs cannot rot.

Each ```python block of every ``docs/*.md`` and of ``README.md`` is executed, in order, one
namespace per page, in a fresh working directory (so relative store paths land in a temporary
directory). A page's blocks build on each other the way a reader types them. Classes a page
defines live in a real module (``docs_<page>``), so stores can import them back.

A ```python block whose first line is a comment naming a file, ``# example_model.py``, is also
written to that file in the working directory, which is on ``sys.path``: later blocks can
import it (``from example_model import Layer``) the way a reader's script would.

A page that sets ``jax_num_cpu_devices`` (to simulate several devices; JAX reads it only as
it starts) to other than the 8 every test process has (``tests/conftest.py``) runs in a fresh
interpreter of its own: ``python tests/test_docs.py PAGE``.

A ```console block runs each of its ``$ pytreestore ...`` lines, in the same directory, and
each must exit with status 0 (in this process, through click; tests/test_cli.py runs the
installed script itself).

A block is marked by an HTML comment on the line just above its fence, which neither GitHub
nor the docs site shows (a word after the language, as in ```python no-run, would break the
site's fences). Keep marks rare: a block that shows a mistake should usually show it caught.

* ``<!-- test: raises=NAME -->``: the block must raise the exception class NAME (a builtin or
  a name from ``pytreestore.errors``); the page goes on after it.
* ``<!-- test: needs=MODULE -->``: the block is skipped where the optional module MODULE
  (xarray, say) is not installed.
* ``<!-- test: no-run -->``: the block is not run, for code that cannot run here (it needs a
  cluster, or a file the reader has and we do not).
"""

from __future__ import annotations

import builtins
import dataclasses
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import jax
import pytest
from click.testing import CliRunner

from pytreestore import errors
from pytreestore.cli import main
from tests import interpreters
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
_FENCE = re.compile(
    r"^(?P<indent> *)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
#: a page's device count: JAX reads it only as it starts, so another count needs another process
_DEVICES = re.compile(r"""jax\.config\.update\(["']jax_num_cpu_devices["'], (\d+)\)""")
_FILE = re.compile(r"# (?P<file>[\w.-]+\.py)\n")
_MARK = re.compile(r"^ *<!-- test: (?P<options>.*?) -->[ \t]*$")


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    page: Path
    line: int
    language: str
    options: tuple[str, ...]
    code: str

    def option(self, name: str) -> str | None:
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value or key
        return None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, with their language, options and dedented code."""
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        language = (match["info"].strip().split() or [""])[0]
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.match(before)
        options = mark["options"].split() if mark else []
        indent = len(match["indent"])
        code = "".join(line[indent:] for line in match["body"].splitlines(keepends=True))
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, language, tuple(options), code))
    return found


def test_pages_are_found() -> None:
    names = {p.name for p in PAGES}
    assert {"README.md", "index.md", "quickstart.md", "concepts.md", "migration.md"} <= names
    assert {"faq.md", "cli.md", "api.md"} <= names


def test_blocks_are_extracted() -> None:
    page = ROOT / "docs" / "faq.md"
    assert any(b.language == "python" for b in blocks(page))
    assert all(b.code.endswith("\n") for b in blocks(page))


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_code_runs(page: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runnable = [b for b in blocks(page) if b.language in ("python", "console")]
    if not runnable:
        pytest.skip(f"{page.name} has no python or console blocks")
    counts = {int(n) for b in runnable for n in _DEVICES.findall(b.code)}
    if counts - {jax.device_count()}:
        result = interpreters.run(  # forked (tests/interpreters.py): JAX not started there
            [sys.executable, "-W", "error", __file__, str(page)],
            cwd=tmp_path,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, f"{page.name}:\n{result.stdout}\n{result.stderr}"
        return
    run_page(page, tmp_path)
    capsys.readouterr()


def run_page(page: Path, cwd: Path) -> None:
    """Runs every block of ``page`` in order in ``cwd``, in one module named after the page."""
    name = "docs_" + re.sub(r"\W", "_", page.stem)
    module = types.ModuleType(name)
    module.__file__ = str(cwd / f"{name}.py")
    saved_cwd, saved_path = os.getcwd(), list(sys.path)
    modules, x64 = set(sys.modules), jax.config.jax_enable_x64
    os.chdir(cwd)
    sys.path.insert(0, str(cwd))
    sys.modules[name] = module
    try:
        for block in blocks(page):
            if block.option("no-run") or missing(block.option("needs")):
                continue
            if block.language == "python":
                run_python(block, module, cwd)
            elif block.language == "console":
                run_console(block)
    finally:
        os.chdir(saved_cwd)
        sys.path[:] = saved_path
        jax.config.update("jax_enable_x64", x64)
        for added in set(sys.modules) - modules:  # the page's module and its own files
            if str(getattr(sys.modules[added], "__file__", "")).startswith(str(cwd)):
                del sys.modules[added]


def missing(module: str | None) -> bool:
    return module is not None and importlib.util.find_spec(module) is None


def run_python(block: Block, module: types.ModuleType, cwd: Path) -> None:
    named = _FILE.match(block.code)
    if named:
        (cwd / named["file"]).write_text(block.code)
    code = compile(block.code, block.where, "exec")
    expected = block.option("raises")
    if expected is None:
        exec(code, module.__dict__)
        return
    kind = getattr(errors, expected, None) or getattr(builtins, expected)
    with pytest.raises(kind):
        exec(code, module.__dict__)


def run_console(block: Block) -> None:
    """Runs each ``$ pytreestore ...`` line with the command's own code, in this process."""
    for line in block.code.splitlines():
        if not line.startswith("$ pytreestore"):
            continue
        args = shlex.split(line[2:], comments=True)[1:]
        result = CliRunner().invoke(main, args, prog_name="pytreestore", catch_exceptions=False)
        assert result.exit_code == 0, f"{block.where}: {line}\n{result.output}"


def test_every_page_is_in_the_site_nav() -> None:
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = {next(iter(entry.values())) for entry in config["nav"]}
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages - listed == set(), "add these pages to the nav in mkdocs.yml"
    assert listed - pages == set(), "the nav in mkdocs.yml lists pages that do not exist"


def test_site_builds_strictly(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (make docs installs it)")
    pytest.importorskip("mkdocstrings")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


if __name__ == "__main__":  # one page in a fresh interpreter: python tests/test_docs.py PAGE
    sys.path.insert(0, str(ROOT))
    run_page(Path(sys.argv[1]).resolve(), Path.cwd())


def test_concepts_describe_the_key_escape_the_code_writes():
    """docs/concepts.md's example escapes (issue 33: it said ``%XX``) are what keys.escape
    writes."""
    from pytreestore._format.keys import escape

    text = (ROOT / "docs" / "concepts.md").read_text()
    assert "`-XX`" in text and "`%XX`" not in text
    assert escape("-") == "-2D" and escape("é") == "-C3-A9"
    assert "`-2D`" in text and "`-C3-A9`" in text


def test_the_readme_lists_every_guide():
    """Every page of docs/ but the generated and internal ones is linked from README.md."""
    readme = (ROOT / "README.md").read_text()
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    missing = sorted(p for p in pages if f"docs/{p}" not in readme)
    assert not missing, f"README.md does not link {missing}"
