"""No import cycles between dpkit's modules, read from the source (AST) of the whole package.

A cycle means two modules cannot be understood, tested or loaded apart, and at load time it
turns the order of imports into a source of ``ImportError``s on partly initialised modules. The
graph is read from the source rather than from ``sys.modules`` so that it covers the optional
extras (torch, Spark, FastAPI) whether or not they are installed, and imports that only run
inside a function.

The rule: module A has an edge to module B when A's source holds an ``import`` of B
anywhere — at module level, in a class, in a function, under ``if TYPE_CHECKING:`` — except in a
package ``__init__``'s module-level ``__getattr__`` (PEP 562): a name re-exported lazily is
loaded on first use, after the package has finished loading, so the package does not depend on
what it re-exports.

Imports inside functions are counted: they form no load-time cycle, but they tie the two modules
together all the same, and a function-level import is where a cycle usually hides (the
service's query path called the synthetic route that way while the route imported the query
path). Imports under ``TYPE_CHECKING`` are counted too, although they never run: they tie the
modules for every reader and for the type checker, which must load the two together, and they
are how the per-example engine and its layer units were tied (the units annotated their engine).
Both were cycles that this test was written to remove; a module that needs another's type
without depending on it declares a ``Protocol`` of what it uses instead.

What an import points at:

* ``import a.b.c`` → ``a.b.c`` (the longest prefix that is a dpkit module);
* ``from X import n`` (``X`` relative or absolute) → ``X.n`` when that is a module (a submodule
  imported by name), else ``X`` itself;
* ``from pkg.x import y`` → ``pkg.x`` only, not ``pkg``. Python does import the package ``pkg``
  first, but when ``pkg/__init__.py`` imports ``pkg/x.py`` the package is already being
  imported, so counting the parent would report every package whose ``__init__`` re-exports
  its submodules as a cycle. A submodule that imports a name from its own package's
  ``__init__`` (``from pkg import y`` inside ``pkg/x.py``) is an edge to ``pkg`` and is a real
  cycle when ``pkg/__init__.py`` imports ``pkg.x``.

Each strongly connected component of more than one module (or a module that imports itself) is
reported with the import lines that form it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import dpkit

_SRC = Path(dpkit.__file__).parent

# module → imported module → the import lines ("path:line: source") that make the edge
Graph = dict[str, dict[str, list[str]]]


def _module_name(path: Path, root: Path) -> str:
    parts = (root.name, *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, is_package: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that counts (see the module docstring)."""

    def visit(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        else:
            for child in ast.iter_child_nodes(node):
                yield from visit(child)

    for statement in tree.body:
        lazy = is_package and isinstance(statement, ast.FunctionDef) and statement.name == "__getattr__"
        if not lazy:
            yield from visit(statement)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    def longest_known(name: str) -> str | None:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in known:
                return ".".join(parts[:k])
        return None

    if isinstance(node, ast.Import):
        return {t for a in node.names if (t := longest_known(a.name)) is not None}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        if f"{source}.{alias.name}" in known:
            out.add(f"{source}.{alias.name}")
        elif (t := longest_known(source)) is not None:
            out.add(t)
    return out


def import_graph(root: Path) -> Graph:
    """The edges between the modules of the package at ``root`` (see the module docstring)."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    known = set(files)
    graph: Graph = {m: {} for m in files}
    for module, path in files.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(text, filename=str(path)), is_package):
            for target in _targets(node, module, is_package, known):
                if target != module:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
                    graph[module].setdefault(target, []).append(where)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted (Tarjan's
    algorithm, iterative so that a deep package cannot exhaust the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def describe(graph: Graph, component: list[str]) -> str:
    """A cycle with the import lines between its modules."""
    members = set(component)
    lines = [" <-> ".join(component)]
    for m in component:
        for target, where in sorted(graph[m].items()):
            if target in members:
                lines += [f"    {w}" for w in where]
    return "\n".join(lines)


# -- the project ------------------------------------------------------------------------------------


def test_no_import_cycle_in_dpkit() -> None:
    graph = import_graph(_SRC)
    assert len(graph) > 100 and any(graph.values())  # the walk read the package
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


# -- the rule, on a package written for the test ----------------------------------------------------


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


def test_a_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import helper\n",
            "b.py": "def helper():\n    from . import a\n    return a\n",
            "c.py": "import pkg.a\n",
        },
    )
    graph = import_graph(pkg)
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    report = describe(graph, ["pkg.a", "pkg.b"])
    assert "pkg/a.py:1: from pkg.b import helper" in report and "pkg/b.py:2: from . import a" in report


def test_a_longer_cycle_and_a_relative_parent_import_are_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "x/__init__.py": "",
            "x/one.py": "from ..y.two import f\n",
            "y/__init__.py": "",
            "y/two.py": "from pkg.z import g\ndef f(): pass\n",
            "z.py": "from .x import one\ndef g(): pass\n",
        },
    )
    assert cycles(import_graph(pkg)) == [["pkg.x.one", "pkg.y.two", "pkg.z"]]


def test_a_submodule_importing_from_its_own_package_init_is_a_cycle(tmp_path: Path) -> None:
    pkg = _package(tmp_path, {"__init__.py": "from pkg.sub import f\nX = 1\n", "sub.py": "from pkg import X\n"})
    assert cycles(import_graph(pkg)) == [["pkg", "pkg.sub"]]


def test_a_cycle_through_type_checking_imports_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "engine.py": "from pkg.unit import Unit\n",
            "unit.py": (
                "from typing import TYPE_CHECKING\nimport typing\n"
                "if typing.TYPE_CHECKING:\n    from pkg.engine import Engine\n"
                "class Unit: pass\n"
            ),
        },
    )
    assert cycles(import_graph(pkg)) == [["pkg.engine", "pkg.unit"]]


def test_what_is_not_an_edge(tmp_path: Path) -> None:
    """A package's lazy ``__getattr__``, and ``from pkg.x import y`` seen from
    ``pkg/__init__.py`` (an edge to ``pkg.x`` only), form no cycle; nor does an import of a
    module outside the package."""
    pkg = _package(
        tmp_path,
        {
            "__init__.py": (
                "from pkg.a import A\ndef __getattr__(name):\n    from pkg import lazy\n    return lazy.B\n"
            ),
            "a.py": "import json\nfrom pkg.b import B\nclass A: pass\n",
            "b.py": "import os.path\nclass B: pass\n",
            "lazy.py": "import pkg.a\nfrom pkg.a import A\nB = A\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.a": ["pkg/__init__.py:1: from pkg.a import A"]}
    assert graph["pkg.b"] == {} and set(graph["pkg.lazy"]) == {"pkg.a"}
    assert cycles(graph) == []
