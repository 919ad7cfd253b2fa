"""The package layout is the architecture: each subpackage of autotune/ is a layer that imports only the layers
below it, no module imports another's private names, and the imports have no cycles (lazy ones included).

Read from the source (ast), so nothing is imported and the check is the same on every machine. The table below
is the rule; each subpackage's __init__.py docstring says the same in its "May import:" line (checked too).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "autotune"

# layer → the layers it may import (besides itself; space/ and third-party packages are always allowed)
LAYERS: dict[str, set[str]] = {
    "build": set(),
    "launch": set(),
    "store": set(),
    "measure": {"build", "launch"},
    "landscapes": {"build", "launch", "measure", "store"},
    "search": {"build", "launch", "measure", "store", "landscapes"},
    "runtime": {"build", "launch", "store"},
    "integrations": {"runtime"},
    "report": set(),
    "commands": {"build", "launch", "measure", "store", "landscapes", "search", "runtime", "report"},
}
# modules directly in autotune/: the package's face (autotune.attention) and the CLI's entry point
TOP_LEVEL: dict[str, set[str]] = {
    "autotune": {"runtime"},
    "autotune.cli": {"commands"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[tuple[str, list[str]]]:
    """(imported autotune module, names taken from it) for one import statement."""
    if isinstance(node, ast.Import):
        return [(a.name, []) for a in node.names if a.name.split(".")[0] == "autotune"]
    if node.level:
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        base = package.split(".")
        base = base[:len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "autotune":
        return []
    out = []
    names = []
    for a in node.names:
        sub = f"{target}.{a.name}"
        if sub in MODULES:
            out.append((sub, []))  # `from package import module`
        else:
            names.append(a.name)
    if names or not out:
        out.append((target, names))
    return out


def _imports() -> list[tuple[str, str, list[str], int, bool]]:
    """(importing module, imported module, names, line, at module level) for every autotune import."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, names in _resolve(module, path, node):
                    found.append((module, target, names, node.lineno, id(node) in top))
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def upward_imports() -> list[str]:
    bad = []
    for module, target, _, line, _ in _imports():
        here, there = _layer(module), _layer(target)
        if here is None:
            allowed = TOP_LEVEL.get(module)
            if allowed is None:
                bad.append(f"{module}: a module directly in autotune/ that no layer owns")
            elif there not in allowed and target != "autotune":
                bad.append(f"{MODULES[module]}:{line}: {module} imports {target}, outside {sorted(allowed)}")
            continue
        if there is None:
            bad.append(f"{MODULES[module]}:{line}: {module} imports {target} (top level: only the CLI and "
                       "autotune/__init__.py live there)")
        elif there != here and there not in LAYERS[here]:
            bad.append(f"{MODULES[module]}:{line}: layer {here} imports layer {there} ({target}); {here} may import "
                       f"{sorted(LAYERS[here]) or 'no other layer'}")
    return bad


def private_imports() -> list[str]:
    """`from other import _name`, and `other._name` on an imported autotune module."""
    bad = []
    imports = _imports()
    for module, target, names, line, _ in imports:
        for n in names:
            if n.startswith("_") and not n.startswith("__") and target != module:
                bad.append(f"{MODULES[module]}:{line}: {module} imports {target}.{n}")
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        bound = {}  # local name → autotune module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    for target, _ in _resolve(module, path, node):
                        if target.endswith("." + a.name) or target == a.name:
                            bound[a.asname or a.name.split(".")[0]] = target
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                    and node.attr.startswith("_") and not node.attr.startswith("__")
                    and bound[node.value.id] != module):
                bad.append(f"{path}:{node.lineno}: {module} uses {bound[node.value.id]}.{node.attr}")
    return bad


def import_cycles() -> list[list[str]]:
    """Strongly connected components of more than one module in the import graph, lazy imports included."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, target, _, _, _ in _imports():
        if target in MODULES and target != module and MODULES[target].name != "__init__.py":
            graph[module].add(target)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_layer_imports_a_higher_one():
    assert upward_imports() == []


def test_no_module_imports_another_modules_private_names():
    assert private_imports() == []


def test_no_import_cycles():
    assert import_cycles() == []


def test_the_table_covers_every_subpackage():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file() and not p.name.startswith("_")}
    assert subpackages == set(LAYERS)


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_says_what_it_owns_and_may_import(layer):
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
    assert "Owns:" in doc and "Public names:" in doc, f"autotune/{layer}/__init__.py: say what it owns and exports"
    m = re.search(r"May import: (.*?)(?:\.\s|\.$|$)", doc, re.S)
    assert m, f"autotune/{layer}/__init__.py: no 'May import:' line"
    named = set(re.findall(r"\b(" + "|".join(LAYERS) + r")\b", m.group(1).split("(")[0]))
    assert named == LAYERS[layer], f"autotune/{layer}/__init__.py says it may import {sorted(named)}"


if __name__ == "__main__":  # python3 tests/test_layers.py: the same checks, as a report
    for title, found in (("upward imports", upward_imports()), ("private imports", private_imports()),
                         ("import cycles", import_cycles())):
        print(f"{title}: {len(found)}")
        for line in found:
            print(f"  {line}")
