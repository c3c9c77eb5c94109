"""The import graph of analysis/, components/ and views/ has no circles (read from the source with ast).

Every import counts, also one inside a function: a lazy import hides a circle from Python's loader, not
from the reader who has to hold both modules in mind. Importing a package runs its `__init__`, so
`from analysis.kv import runner` is an edge to `analysis.kv` and to `analysis.kv.runner`.
"""
from __future__ import annotations

import ast
from pathlib import Path

from analysis.paths import ROOT
TOPS = ("analysis", "components", "views")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for top in TOPS for p in sorted((ROOT / top).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (any depth in the file), each with its parent packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets.add(stem)
            targets.update(f"{stem}.{alias.name}" for alias in node.names)  # `from pkg import module`
    out = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != name and not name.startswith(prefix + "."):
                out.add(prefix)
    return out


def graph() -> dict[str, set[str]]:
    mods = our_modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_package_import_counts_its_init(tmp_path):
    (tmp_path / "p").mkdir()
    f = tmp_path / "p" / "m.py"
    f.write_text("def f():\n    from analysis.kv import runner\n")
    # its own parent package (`analysis`) is not an edge: it is always imported first, by Python itself
    assert imports_of("analysis.x", f, {"analysis", "analysis.kv", "analysis.kv.runner"}) == {
        "analysis.kv", "analysis.kv.runner"}


# Modules still in a circle while the panels move into packages (issue 30): each leaves this set when its
# panel is split, and the set must end empty.
TRANSITIONAL: set[str] = set()


def test_no_import_circles():
    found = [c for c in cycles(graph()) if not set(c) <= TRANSITIONAL]
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_transitional_set_holds_only_modules_in_circles():
    still = {m for c in cycles(graph()) for m in c}
    assert not TRANSITIONAL - still, f"no longer in a circle, so remove: {sorted(TRANSITIONAL - still)}"
