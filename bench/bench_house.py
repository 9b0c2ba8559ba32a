"""The package's structure in figures (issue "the house"): modules, internal imports (those
inside functions counted too), import cycles, the longest functions, the largest classes and
the broad exception handlers whose body neither re-raises nor logs.

    python bench/bench_house.py [--top 10]

Read-only: it parses the sources with ``ast`` and imports nothing of the package.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mlflow_ngraph"
BROAD = {"Exception", "BaseException"}
LOGS = {"debug", "info", "warning", "error", "exception", "critical", "warn"}


#: the layers a run's data flows up through, lowest first: a module may import its own
#: layer's and the ones below (first match by the module's name under the package:
#: ``tracking.schema`` is the names every layer writes under, so it sits with the core)
LAYERS = (
    ("core", ("errors", "faultpoint", "variables", "table", "scratch", "env", "devices", "keys",
              "cache", "console", "redaction", "text", "tracking.schema")),
    ("what is measured", ("models", "compilers")),
    ("measure", ("measure",)),
    ("plan", ("plan",)),
    ("record", ("tracking",)),
    ("run", ("run",)),
    ("use", ("report", "deploy", "tune", "loadgen", "gate")),
    ("commands", ("commands", "__main__", "cluster", "")),
)  # fmt: skip


#: the longest a function and a class may be, in lines from its ``def`` or ``class`` line
#: to its last, docstring included (``tests/test_layout.py`` holds the package to them)
LIMITS = {"functions": 50, "classes": 300}


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (a dotted name under the package; the
    package itself, its public functions, is at the top)."""
    rest = module.partition(".")[2]
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if rest == prefix or (prefix and rest.startswith(prefix + ".")):
                return index
    raise KeyError(f"{module} is in no layer of bench_house.LAYERS: add it to one")


def arrows_up(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Every import of a module in a higher layer than the importer's."""
    return sorted((m, d) for m, deps in graph.items() for d in deps if layer(d) > layer(m))


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    """Whether ``name`` is a module or package of the package (not a name inside one)."""
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imports(tree: ast.AST, here: str, is_package: bool) -> tuple[set[str], int]:
    """The package modules ``here`` imports, and how many of its imports sit in functions."""
    found, inside = set(), 0
    base = here if is_package else here.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool) -> None:
        nonlocal inside
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                root = child.module or ""
                if child.level:
                    up = base.split(".")
                    up = up[: len(up) - child.level + 1]
                    root = ".".join([*up, root] if root else up)
                # ``from pkg import mod`` needs the module; ``from pkg import name`` the
                # package (its __init__)
                names = [f"{root}.{a.name}" if is_module(f"{root}.{a.name}") else root
                         for a in child.names]  # fmt: skip
            internal = [n for n in names if n.split(".")[0] == PACKAGE.name]
            if internal:
                inside += in_function
                found.update(internal)
            visit(child, nested)

    visit(tree, False)
    return found, inside


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in list(graph):
        if v not in index:
            strong(v)
    return out


def silent_broad(handler: ast.ExceptHandler) -> bool:
    """A handler of Exception, BaseException or everything whose body neither raises, nor
    calls a logger, nor hands the exception on (uses the name it bound: a failure recorded
    for the caller to report, sent to the parent process, kept as a cell's reason)."""
    kind = handler.type
    names = {getattr(kind, "id", None)} | {
        getattr(e, "id", None) for e in getattr(kind, "elts", [])
    }
    if kind is not None and not names & BROAD:
        return False
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return False
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in LOGS:
            return False
        if handler.name and isinstance(node, ast.Name) and node.id == handler.name:
            return False
    return True


def private_imports(tree: ast.AST, here: str) -> list[str]:
    """The private names (``_x``) ``here`` imports from another module of the package."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE.name):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append(f"{here} imports {node.module}.{alias.name}")
    return out


def survey() -> dict:
    """The package's import graph (module -> the modules it imports, inside functions
    too), its knots, and the figures below."""
    modules = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    functions, classes, silent, private, inside_total = [], [], [], [], 0
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        found, inside = imports(tree, name, path.name == "__init__.py")
        inside_total += inside
        graph[name] = {m for m in (_owner(f, modules) for f in found) if m and m != name}
        private += private_imports(tree, name)
        for node in ast.walk(tree):
            span = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            where = f"{path.relative_to(PACKAGE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((span, f"{where} {node.name}"))
            elif isinstance(node, ast.ClassDef):
                classes.append((span, f"{where} {node.name}"))
            elif isinstance(node, ast.ExceptHandler) and silent_broad(node):
                silent.append(where)
    return {
        "modules": modules, "graph": graph, "knots": cycles(graph), "inside": inside_total,
        "functions": functions, "classes": classes, "silent": silent, "private": private,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    found = survey()
    graph, knots = found["graph"], found["knots"]
    edges = sum(len(v) for v in graph.values())
    print(f"modules {len(found['modules'])}, internal import edges {edges}")
    print(f"  imports of the package inside functions: {found['inside']}")
    print(f"import cycles (modules in one strongly connected knot): {len(knots)}")
    for knot in knots:
        print(f"  {len(knot)}: {', '.join(knot)}")
    up = arrows_up(graph)
    print(f"imports from a higher layer: {len(up)}")
    for module, imported in up[: args.top]:
        print(f"  {module} -> {imported}")
    print(f"private names imported from another module: {len(found['private'])}")
    for line in found["private"][: args.top]:
        print(f"  {line}")
    for label, limit in LIMITS.items():
        items = found[label]
        over = sum(1 for span, _ in items if span > limit)
        print(f"{label} over {limit} lines: {over}; the longest:")
        for span, where in sorted(items, reverse=True)[: args.top]:
            print(f"  {span:5d}  {where}")
    print(f"broad handlers that neither re-raise, log nor hand on: {len(found['silent'])}")
    for where in found["silent"][: args.top]:
        print(f"  {where}")


def _owner(imported: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name lives in (``pkg.mod.func`` -> ``pkg.mod``)."""
    while imported and imported not in modules:
        imported = imported.rpartition(".")[0]
    return imported or None


if __name__ == "__main__":
    main()
