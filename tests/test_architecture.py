"""The layout rules of docs/architecture.md, checked on the package's source.

No import cycle between modules (lazy imports inside functions count; ``TYPE_CHECKING`` ones
do not) nor between the package's folders; no private name of another module;
no module over 500 lines; at most 10 lines that dispatch on whether a store is ragged; no
test of a layout node's kind outside the layout's own modules.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

import pytest

import pytreestore

ROOT = Path(pytreestore.__file__).parent
LIMIT = 500


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _runtime_imports(path: Path) -> list[ast.ImportFrom | ast.Import]:
    tree = ast.parse(path.read_text())
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for n in ast.walk(node))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in hidden
    ]


def _targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(module imported, name taken from it or None) for our own modules."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.startswith("pytreestore")]
    if not node.module or not node.module.startswith("pytreestore"):
        return []
    out = []
    for alias in node.names:
        full = f"{node.module}.{alias.name}"
        out.append((full, None) if full in MODULES else (node.module, alias.name))
    return out


def _graph() -> dict[str, set[str]]:
    graph = collections.defaultdict(set)
    for name, path in MODULES.items():
        for node in _runtime_imports(path):
            for module, _ in _targets(node):
                if module in MODULES and module != name:
                    graph[name].add(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in list(graph):
        if v not in index:
            visit(v)
    return groups


def _package(module: str) -> str:
    """The folder a module belongs to (``pytreestore._format``), or the module itself for
    the package's top-level modules (``pytreestore._store``)."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "backends":
        return "pytreestore.backends"
    if len(parts) >= 3:
        return ".".join(parts[:2])
    return module


def test_the_checks_see_the_whole_package():
    assert {"pytreestore._store", "pytreestore._format.schema", "pytreestore._read.reader"} <= set(
        MODULES
    )
    assert len(_graph()["pytreestore._store"]) > 5


def test_no_import_cycle_between_modules():
    assert _cycles(_graph()) == []


def test_no_import_cycle_between_packages():
    packages: dict[str, set[str]] = collections.defaultdict(set)
    for source, targets in _graph().items():
        for target in targets:
            if _package(source) != _package(target) and source != "pytreestore":
                packages[_package(source)].add(_package(target))
    assert _cycles(packages) == []


def test_no_private_name_from_another_module():
    """Not even within a package: a name one module needs of another is public there."""
    found = []
    for name, path in MODULES.items():
        aliases: dict[str, str] = {}
        for node in _runtime_imports(path):
            for module, taken in _targets(node):
                private = taken is not None and taken[:1] == "_" and taken[:2] != "__"
                if private and module != name:
                    found.append(f"{name}: from {module} import {taken}")
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if full in MODULES:
                        aliases[alias.asname or alias.name] = full
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and aliases[node.value.id] != name
            ):
                found.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    assert found == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_is_under_the_size_limit(name):
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= LIMIT, f"{name} has {lines} lines; split it by concept (limit {LIMIT})"


#: a line that branches on whether a store is ragged (add here any flag named for it): its
#: ragged section or layout (absent in a fixed store), a commit record's or fragment's
#: ``tables`` (none listed in a fixed store's), the writer's committer (a fixed tree's own)
#: (a layout node's kind, ``isinstance(spec, RaggedList)``, is the record model's walk, not a
#: branch on the kind of store: :func:`test_only_the_layout_tells_node_kinds_apart`)
DISPATCH = re.compile(
    r"ragged is (not )?None|isinstance\([^)]*Ragged(?!List\))\w*\)|\bis_(ragged|fixed|tabled)\b"
    r"|\.(tables|layout) is (not )?None|isinstance\([^)]*Committer\)|committer is (not )?None"
)
#: an ``assert`` narrows a type for the checker: no branch
NOT_A_BRANCH = re.compile(r"^assert ")
#: the folder of pytree values: ragged= / optional= declarations (``decl.is_ragged(at)``) and
#: layouts are its own concept, not dispatch sites
RAGGED_PARTS = ("_tree",)
#: every dispatch site, one entry per line: (module, the feature that truly differs)
DISPATCH_SITES = sorted(
    [
        ("pytreestore._format.schema", "the record model: a fixed store has no axis tables"),
        ("pytreestore._format.schema", "the record model: a fixed store has no pending parts"),
        ("pytreestore._log.model", "open: a fixed store's records need no layout"),
        (
            "pytreestore._fragments.fragment",
            "format 3: a fixed store's fragment has no schema file",
        ),
        ("pytreestore._read.engine", "reads: the record table alone, or its axis tables too"),
        ("pytreestore._open.open", "create: ragged=/optional= declare tables"),
        ("pytreestore._cli.commands", "CLI head/show: ragged records are read one by one"),
        ("pytreestore._ray.blocks", "Ray blocks: a fixed store's as numpy batches, both ways"),
        # batches without a mask, and a walk of a fixed tree costs 3.7x per append, 8x per extend
        ("pytreestore._write.records", "the writer: a fixed tree's records are rows, no walk"),
    ]
)
#: sites left from modules being changed elsewhere; the others must reach at most 5
LATER: set[str] = set()


def _dispatch_lines() -> list[tuple[str, str]]:
    """``(module, line)`` of each line outside the ragged implementation that dispatches."""
    return [
        (name, line.strip())
        for name, path in sorted(MODULES.items())
        if [*name.split("."), ""][1] not in RAGGED_PARTS
        for line in path.read_text().splitlines()
        if DISPATCH.search(line) and not NOT_A_BRANCH.match(line.strip())
    ]


def test_few_places_dispatch_on_ragged_stores():
    found = _dispatch_lines()
    assert not LATER
    assert len(DISPATCH_SITES) <= 9
    assert sorted(name for name, _ in found) == [name for name, _ in DISPATCH_SITES], (
        "a line that branches on whether a store is ragged was added or removed; make the "
        "fixed and ragged paths one (schema.tables, record_reads, RecordWriter), or, where "
        "a feature truly differs, list it in DISPATCH_SITES:\n"
        + "\n".join(f"  {name}: {line}" for name, line in found)
    )


def test_the_dispatch_check_sees_a_new_site():
    assert DISPATCH.search("if store.schema.ragged is not None:")
    assert DISPATCH.search("elif isinstance(writer, RaggedWriter):")
    assert DISPATCH.search("if schema.is_ragged:")
    assert not DISPATCH.search("for axis in schema.tables.axes:")
    assert not DISPATCH.search("if isinstance(spec, RaggedList):")
    assert DISPATCH.search("if fragment.tables is not None:")
    assert DISPATCH.search("tables = None if commit.tables is None else dict(commit.tables)")
    assert DISPATCH.search("if schema.layout is not None:")
    assert DISPATCH.search("if committer is not None:")
    assert DISPATCH.search("if isinstance(self._committer, Committer):")
    assert not DISPATCH.search("rows = self.tables if tables is None else tables")
    assert NOT_A_BRANCH.match("assert schema.layout is not None, schema")


#: the layout's own modules: the only ones that tell its node kinds apart; the others pass
#: a :class:`~pytreestore._tree.layout_nodes.Visitor` (a method per kind)
LAYOUT_MODULES = ("pytreestore._tree.layout", "pytreestore._tree.layout_nodes")
NODE_KINDS = {"Leaf", "Kept", "RaggedList", "OptionalTree", "Fixed", "Axis", "LayoutNode"}
#: modules that still test node kinds, left to a later round (their owner was changing them)
NODE_KIND_PENDING: set[str] = set()


def _kind_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The local names of the layout's node kinds in a module, and of the layout's modules."""
    kinds: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in LAYOUT_MODULES:
            kinds |= {a.asname or a.name for a in node.names if a.name in NODE_KINDS}
        elif isinstance(node, ast.ImportFrom) and node.module:
            full = {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
            modules |= {local for local, name in full.items() if name in LAYOUT_MODULES}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in LAYOUT_MODULES}
    return kinds, modules


def _names_a_kind(expr: ast.AST, kinds: set[str], modules: set[str]) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in kinds:
            return True
        if isinstance(node, ast.Attribute) and node.attr in NODE_KINDS:
            base = ast.unparse(node.value)
            if base in modules or base.split(".")[-1] in {m.split(".")[-1] for m in modules}:
                return True
    return False


def _kind_tests(source: str) -> list[str]:
    """The lines of ``source`` that test a layout node's kind: ``isinstance`` or
    ``issubclass`` with a node class, ``type(x) is Leaf`` (``==``, ``in``), a ``match`` case
    on a node class."""
    tree = ast.parse(source)
    kinds, modules = _kind_names(tree)
    found = []
    for node in ast.walk(tree):
        tested: ast.AST | None = None
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("isinstance", "issubclass"):
            tested = node.args[1] if len(node.args) > 1 else None
        elif isinstance(node, ast.Compare) and "type(" in ast.unparse(node.left):
            tested = ast.Tuple(elts=node.comparators, ctx=ast.Load())
        elif isinstance(node, ast.MatchClass):
            tested = node.cls
        if tested is not None and _names_a_kind(tested, kinds, modules):
            found.append(ast.unparse(node))
    return found


def test_only_the_layout_tells_node_kinds_apart():
    found = {
        name: lines
        for name, path in sorted(MODULES.items())
        if name not in LAYOUT_MODULES
        for lines in [_kind_tests(path.read_text())]
        if lines
    }
    assert set(found) == NODE_KIND_PENDING, (
        "a module outside the layout's own tests a layout node's kind; pass a "
        "pytreestore._tree.layout_nodes.Visitor (a method per kind) instead:\n"
        + "\n".join(f"  {name}: {line}" for name, lines in found.items() for line in lines)
    )


def test_the_node_kind_check_sees_each_form():
    head = "from pytreestore._tree.layout_nodes import Leaf, Fixed as F, RaggedList\n"
    assert _kind_tests(head + "isinstance(spec, Leaf)")
    assert _kind_tests(head + "isinstance(spec, RaggedList | F)")
    assert _kind_tests(head + "isinstance(spec, (int, F))")
    assert _kind_tests(head + "type(spec) is Leaf")
    assert _kind_tests(head + "match spec:\n    case Leaf(path=p):\n        pass")
    other = "from pytreestore._tree import layout_nodes as ln\n"
    assert _kind_tests(other + "isinstance(spec, ln.OptionalTree)")
    assert not _kind_tests(head + "isinstance(column, LeafColumn)")
    assert not _kind_tests("class Leaf: ...\nisinstance(x, Leaf)")  # another module's Leaf


#: the one module that makes threads: thread pools and the background jobs' threads
THREADS_MADE_IN = "pytreestore._runtime"
#: what makes a thread or a pool, called or subclassed
THREAD_MAKERS = re.compile(r"(^|\.)(Thread|ThreadPoolExecutor|ProcessPoolExecutor|ExitSafePool)$")


def _thread_makers(source: str) -> list[str]:
    """The calls in ``source`` that make a thread or a thread pool, and the classes that
    subclass one (``ast.unparse`` of each)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and THREAD_MAKERS.search(ast.unparse(node.func)):
            found.append(ast.unparse(node))
        if isinstance(node, ast.ClassDef):
            found += [
                f"class {node.name}({ast.unparse(b)})"
                for b in node.bases
                if THREAD_MAKERS.search(ast.unparse(b))
            ]
    return found


def test_threads_are_made_only_by_the_runtime():
    found = [
        f"{name}: {call}"
        for name, path in sorted(MODULES.items())
        if name != THREADS_MADE_IN
        for call in _thread_makers(path.read_text())
    ]
    assert found == [], (
        "a thread or thread pool is made outside pytreestore/_runtime.py; take a kept pool "
        "(RUNTIME.slab_pool()), a pool for the call (RUNTIME.call_pool(n)) or a thread "
        "(_runtime.thread) from there, with its size as a knob of RUNTIME.threads:\n"
        + "\n".join(f"  {line}" for line in found)
    )
    assert _thread_makers(MODULES[THREADS_MADE_IN].read_text())


def test_the_thread_check_sees_a_new_pool():
    assert _thread_makers("with ThreadPoolExecutor(4) as pool: pass")
    assert _thread_makers("import threading\nthreading.Thread(target=f).start()")
    assert _thread_makers("class P(futures.ThreadPoolExecutor): pass")
    assert _thread_makers("loop.set_default_executor(ExitSafePool(2))")
    assert not _thread_makers("with RUNTIME.call_pool(4) as pool: pass")
    assert not _thread_makers("threading.Event()")


#: at most this many modules (issue 45: 193 before; every ``.py`` file of the package counts)
MODULE_LIMIT = 150
#: module names that mean the same thing in each folder where they appear
SAME_MEANING = {"__init__", "backend"}


def _stem(name: str) -> str:
    """A name as its folder or module would collide: ``_reads`` and ``_read``,
    ``_fragmenting`` and ``_fragments`` are one stem."""
    stem = name.lstrip("_").removesuffix(".py")
    stem = stem.removesuffix("ing") if len(stem) > 6 else stem
    return stem.rstrip("s")


def test_the_package_has_few_modules():
    assert len(MODULES) <= MODULE_LIMIT, (
        f"{len(MODULES)} modules: merge modules of one concept (limit {MODULE_LIMIT})"
    )


def test_no_folder_collides_with_a_module_beside_it():
    found = []
    for folder in [ROOT, *[p for p in ROOT.rglob("*") if p.is_dir()]]:
        if folder.name == "__pycache__":
            continue
        subfolders = {
            _stem(p.name): p.name for p in folder.iterdir() if (p / "__init__.py").exists()
        }
        for module in folder.glob("*.py"):
            face = not module.name.startswith("_")  # ray.py, the public face of _ray/
            if _stem(module.name) in subfolders and subfolders[_stem(module.name)] != (
                f"_{module.stem}" if face else None
            ):
                found.append(f"{module.relative_to(ROOT)} beside {subfolders[_stem(module.name)]}/")
    assert found == []


def test_a_module_name_means_one_thing():
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for name in MODULES:
        path = MODULES[name]
        by_name[path.stem].append(name)
    repeated = {
        stem: names
        for stem, names in by_name.items()
        if len(names) > 1 and stem not in SAME_MEANING
    }
    assert repeated == {}, "modules of one name in several folders: name each for its concept"


def test_the_name_checks_see_a_collision():
    assert _stem("_reads.py") == _stem("_read")
    assert _stem("_fragmenting.py") == _stem("_fragments")
    assert _stem("_store.py") != _stem("_read")
