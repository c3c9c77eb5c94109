"""The project's import graph, read from the source with ast: no circles between modules, and none between
rooms, so every import runs downward.

A room is a top-level file or folder of the layout (`analysis/zoo/`, `components/`, `views/`, `scripts/`,
`benchmarks/`, `app.py`), and each module of the three shared packages (`analysis/framework/`,
`analysis/model_access/`, `analysis/hosting/`) is a room of its own: `analysis/model_access/models.py`,
as each was when they lay flat. Two rooms that import each other (through any files) are one
concern cut in two, or a lower floor reaching up: the room graph must be acyclic.

Every import counts, also one inside a function: a lazy import hides a circle from Python's loader, not
from the reader who has to hold both modules in mind. Importing a package runs its `__init__`, so
`from analysis.kv import runner` is an edge to `analysis.kv` and to `analysis.kv.runner`. A string import
with a literal name (`importlib.import_module("x.y")`, `__import__("x.y")`) counts as an import. The panel
table (analysis/framework/panels.py) names the panel packages by string on purpose (a plugin table: each package
imports `panels`, never the other way), so only literal call arguments count as imports; but analysis/
must not name a module of the app's upper floors at all, not even in a string.
"""
from __future__ import annotations

import ast
from pathlib import Path

from analysis.framework.paths import ROOT

TOPS = ("analysis", "components", "views", "scripts", "benchmarks", "app.py")
UPPER = ("components", "views", "scripts", "benchmarks", "app")  # what analysis/ never reaches
STRING_IMPORTERS = {"import_module", "__import__"}
KIND_PACKAGES = ("framework", "model_access", "hosting")  # analysis/'s shared code, grouped by kind


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    out = {}
    for top in TOPS:
        paths = [ROOT / top] if top.endswith(".py") else sorted((ROOT / top).rglob("*.py"))
        out.update({module_name(p): p for p in paths})
    return out


def room(module: str) -> str:
    """`analysis.zoo.train.lm` -> `analysis.zoo`; `analysis.model_access.models` -> itself; `components.x.y` -> `components`."""
    parts = module.split(".")
    if parts[0] != "analysis":
        return parts[0]
    return ".".join(parts[:3] if len(parts) > 1 and parts[1] in KIND_PACKAGES else parts[:2])


def string_imports(tree: ast.AST) -> set[str]:
    """Literal names given to `importlib.import_module(...)` or `__import__(...)`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            arg = node.args[0]
            if name in STRING_IMPORTERS and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value)
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (any depth in the file), each with its parent packages."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    targets: set[str] = string_imports(tree)
    for node in ast.walk(tree):
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


def room_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for source, targets in edges.items():
        mine = rooms.setdefault(room(source), set())
        mine.update(room(t) for t in targets if room(t) != room(source) and t != "analysis")
    return rooms


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
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


def links(edges: dict[str, set[str]], rooms: list[str]) -> list[str]:
    """The module imports that tie a circle of rooms, for the failure message."""
    inside = set(rooms)
    return sorted(f"{s} -> {t}" for s, ts in edges.items() for t in ts
                  if room(s) in inside and room(t) in inside and room(s) != room(t) and t != "analysis")


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


def test_a_string_import_with_a_literal_name_counts(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import importlib\n\ndef f(name):\n    importlib.import_module('components.warm')\n"
                 "    __import__('analysis.kv')\n    importlib.import_module(name)\n")
    assert imports_of("analysis.x", f, {"components", "components.warm", "analysis.kv"}) == {
        "components", "components.warm", "analysis.kv"}


def test_rooms_are_a_top_file_or_folder():
    assert room("analysis.zoo.train.lm") == "analysis.zoo"
    assert room("analysis.model_access.models") == "analysis.model_access.models"
    assert room("components.figures.kv") == "components"
    assert cycles(room_graph({"analysis.zoo.cards": {"analysis.model_access.models"}, "analysis.model_access.models": {"analysis.zoo.real"},
                              "analysis.zoo.real": set()})) == [["analysis.model_access.models", "analysis.zoo"]]


def test_no_import_circles():
    found = cycles(graph())
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_circles_between_rooms():
    edges = graph()
    found = cycles(room_graph(edges))
    assert not found, "rooms that import each other (an import that runs back up): " + "; ".join(
        f"{' <-> '.join(c)} via {links(edges, c)}" for c in found)


def test_analysis_never_names_the_app_above_it():
    """analysis/ computes; the pages, scripts and benchmarks sit above it. Not even a string names them."""
    known = set(our_modules())
    upper = {m for m in known if m.split(".")[0] in UPPER}
    found = []
    for path in sorted((ROOT / "analysis").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        named = {s for s in strings if s in upper} | {
            t for t in imports_of(module_name(path), path, known) if t in upper}
        found += [f"{path.relative_to(ROOT)} -> {m}" for m in sorted(named)]
    assert not found, f"analysis/ reaches up into the app: {found}"


# The rules of analysis/'s kinds (each package's `__init__` docstring says them in words). A kind is the
# second part of a module name: `analysis.kv.runner` -> `kv`. What each kind may import besides itself:
PANELS = ("sharpness", "kv", "inversion", "captions", "sae_v", "residual")
SEAMS = ("backends", "tasks", "world", "zoo")  # the capture seam and the data packages panels share
BASE = {"framework", "model_access"}
MAY_IMPORT = {
    "framework": {"model_access"},  # only the cost gate, precompute and presets read model access
    "model_access": {"framework", "world"},  # the tiny models' Shapes World tokenizer
    "hosting": BASE,
    **{panel: BASE | {"backends", "tasks", "world"} for panel in PANELS},
    "backends": BASE,
    "tasks": BASE | {"world"},
    "world": BASE,
    "zoo": BASE | {"world", "residual"},  # the zoo trains the residual panel's tuned lenses
    "talks": BASE,  # talks are data: steps naming presets, read through the framework
    "__main__": BASE,  # `python -m analysis`: the panel table names the CLIs by string
}


def kind(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "analysis" and len(parts) > 1 else None


def rule_breaks(edges: dict[str, set[str]]) -> list[str]:
    """Every import from one kind of analysis/ to another that MAY_IMPORT does not allow."""
    out = []
    for source, targets in sorted(edges.items()):
        mine = kind(source)
        if mine is None:
            continue
        allowed = MAY_IMPORT.get(mine)
        for target in sorted(targets):
            theirs = kind(target)
            if theirs is None or theirs == mine:
                continue
            if allowed is None or theirs not in allowed:
                out.append(f"{source} -> {target}")
    return out


def test_every_kind_of_analysis_has_a_rule():
    kinds = {kind(m) for m in our_modules()} - {None}
    assert kinds <= set(MAY_IMPORT), f"a new package in analysis/ needs a line in MAY_IMPORT: {kinds - set(MAY_IMPORT)}"
    assert set(PANELS) <= kinds and {"framework", "model_access", "hosting"} <= kinds


def test_rule_checker_catches_each_kind_of_break():
    planted = {
        "analysis.sae_v.filtering": {"analysis.hosting.export", "analysis.hosting", "analysis.framework.results"},
        "analysis.framework.cost": {"analysis.kv", "analysis.model_access.models"},
        "analysis.model_access.models": {"analysis.residual.lenses", "analysis.world.tokenizer"},
        "analysis.hosting.store": {"analysis.kv.records", "analysis.framework.config"},
        "analysis.kv.runner": {"analysis.residual", "analysis.tasks.kv_recall", "analysis.kv.base"},
        "components.share": {"analysis.hosting.export"},
    }
    assert rule_breaks(planted) == [
        "analysis.framework.cost -> analysis.kv",
        "analysis.hosting.store -> analysis.kv.records",
        "analysis.kv.runner -> analysis.residual",
        "analysis.model_access.models -> analysis.residual.lenses",
        "analysis.sae_v.filtering -> analysis.hosting",
        "analysis.sae_v.filtering -> analysis.hosting.export",
    ]


def test_analysis_kinds_import_by_the_rules():
    """Panels import the framework, model access and the shared seam/data packages, never hosting nor one
    another; model access never a panel (the Shapes World data aside) nor hosting; the framework neither;
    hosting only the framework and model access."""
    found = rule_breaks(graph())
    assert not found, "imports against analysis/'s rules (see MAY_IMPORT): " + "; ".join(found)
