"""The package's architecture, checked statically (``ast``, nothing imported): no import cycles (``TYPE_CHECKING``
imports counted too), the floors of ``tvq_exp/__init__.py``'s docstring (a lower floor never imports a higher one),
no private name reached across modules, one folder per attention mixer (as docs/design.md's map says), and a
stated reason for every module over 300 lines."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.helpers.paths import REPO

PKG = "tvq_exp"
PKG_DIR = REPO / PKG

MAX_LINES = 300
SIZE_REASON = "Over 300 lines:"

# top-level modules the docstring's bullets do not name, with the floor (named by a package on it) they sit on
EXTRA_FLOORS: dict[str, str] = {}

# import edges that break a rule today, each (importer, imported) with the reason it is tolerated; keep it empty
ALLOWED_CYCLE_EDGES: dict[tuple[str, str], str] = {}
ALLOWED_FLOOR_EDGES: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    importer: str  # dotted module name (a package is its __init__)
    imported: str
    path: Path
    line: int
    lazy: bool  # inside a function (runs on call, not on import)
    typing: bool = False  # inside ``if TYPE_CHECKING:`` (never runs, but still couples the two modules)

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module a dotted name lives in: itself if it is a module, else its longest module prefix."""
    known = modules()
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, type_checking: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it sits inside a function; ``if TYPE_CHECKING:`` bodies skipped, or
    (``type_checking``) only those."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, lazy: bool, typing: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if typing == type_checking:
                found.append((node, lazy))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, lazy, True)
            for child in node.orelse:
                visit(child, lazy, typing)
            return
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner, typing)

    visit(tree, False, False)
    return found


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    known = modules()
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names if a.name == PKG or a.name.startswith(PKG + ".")]
        return [t for t in map(_resolve, names) if t]
    if node.level:
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base != PKG and not base.startswith(PKG + "."):
        return []
    targets = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        target = sub if sub in known else _resolve(base)  # a submodule, else a name defined in ``base``
        if target:
            targets.append(target)
    return targets


@cache
def edges(type_checking: bool = False) -> tuple[Edge, ...]:
    """The package's import edges; ``type_checking``: those inside ``if TYPE_CHECKING:`` instead."""
    found = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, lazy in _imports(tree, type_checking):
            for target in _targets(module, path.name == "__init__.py", node):
                if target != module:
                    found.append(Edge(module, target, path, node.lineno, lazy, type_checking))
    return tuple(found)


def _components(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                result.append(sorted(component))
    return result


def _cycle_report(component: list[str], chosen: list[Edge]) -> str:
    members = set(component)
    inside = sorted(
        (e for e in chosen if e.importer in members and e.imported in members),
        key=lambda e: (e.importer, e.line),
    )
    lines = [f"  {e.importer} -> {e.imported}  ({e.where()}{', lazy' if e.lazy else ''})" for e in inside]
    return "cycle among " + ", ".join(component) + ":\n" + "\n".join(lines)


def _cycles(chosen: list[Edge]) -> list[str]:
    graph: dict[str, set[str]] = {m: set() for m in modules()}
    for e in chosen:
        graph[e.importer].add(e.imported)
    return [_cycle_report(c, chosen) for c in _components(graph) if len(c) > 1]


def test_components_find_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "d"}, "e": set()}
    assert sorted(_components(graph)) == [["a", "b", "c"], ["d"], ["e"]]


def test_relative_imports_resolve() -> None:
    def targets(module: str, source: str) -> list[str]:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.Import | ast.ImportFrom)
        return _targets(module, modules()[module].name == "__init__.py", node)

    assert targets("tvq_exp.attention.vq", "from . import layer") == ["tvq_exp.attention.vq.layer"]
    assert targets("tvq_exp.attention.vq.layer", "from ..base import causal_mask") == [
        "tvq_exp.attention.base"
    ]
    assert targets("tvq_exp.attention.ovq.layer", "from .. import vq, build_attention") == [
        "tvq_exp.attention.vq",
        "tvq_exp.attention",
    ]
    assert targets("tvq_exp.run.train", "import tvq_exp.models.module as m") == ["tvq_exp.models.module"]
    assert targets("tvq_exp.run.train", "from tvq_exp.models.module import X") == ["tvq_exp.models.module"]
    assert targets("tvq_exp.run.train", "import torch.nn") == []


def test_type_checking_imports_are_skipped() -> None:
    tree = ast.parse(
        "if TYPE_CHECKING:\n    import tvq_exp.a\nelse:\n    import tvq_exp.b\ndef f():\n    import tvq_exp.c"
    )
    found = [(n.names[0].name, lazy) for n, lazy in _imports(tree) if isinstance(n, ast.Import)]
    assert found == [("tvq_exp.b", False), ("tvq_exp.c", True)]
    typing = [n.names[0].name for n, _ in _imports(tree, type_checking=True) if isinstance(n, ast.Import)]
    assert typing == ["tvq_exp.a"]


def test_edges_are_found() -> None:
    """The collector sees the imports it should (guards the other checks against finding nothing)."""
    pairs = {(e.importer, e.imported) for e in edges()}
    assert (PKG, f"{PKG}.resolvers") in pairs
    assert len(pairs) > 100


def test_no_import_cycles_at_import_time() -> None:
    cycles = _cycles([e for e in edges() if not e.lazy])
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


def test_no_import_cycles_counting_lazy_imports() -> None:
    """A function-level import hides a cycle from the interpreter, not from the design."""
    cycles = _cycles([e for e in edges() if (e.importer, e.imported) not in ALLOWED_CYCLE_EDGES])
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(cycles)


def test_no_import_cycles_counting_type_checking_imports() -> None:
    """An import under ``if TYPE_CHECKING:`` never runs, but the two modules still know each other: a cycle."""
    chosen = [
        e
        for e in (*edges(), *edges(type_checking=True))
        if (e.importer, e.imported) not in ALLOWED_CYCLE_EDGES
    ]
    cycles = _cycles(chosen)
    assert not cycles, "import cycles (TYPE_CHECKING imports included):\n" + "\n".join(cycles)


# ---------------------------------------------------------------- floors


@dataclass(frozen=True)
class Floors:
    floor: dict[str, int]  # top-level name -> floor
    independent: dict[str, str]  # package -> the package it must stay independent of ("independent of the X")


@cache
def floors() -> Floors:
    """The floors as ``tvq_exp/__init__.py``'s docstring lists them: one bullet per floor, lowest first, the
    names in double backticks before the bullet's colon; ``python -m tvq_exp.X`` in a bullet puts the shim
    ``X`` on that floor; ``(independent of the X)`` marks a sibling that must not reach into ``X``'s stack."""
    doc = ast.get_docstring(ast.parse((PKG_DIR / "__init__.py").read_text())) or ""
    bullets = [line[2:] for line in doc.splitlines() if line.startswith("- ")]
    floor: dict[str, int] = {}
    independent: dict[str, str] = {}
    for number, bullet in enumerate(bullets):
        head, _, body = bullet.partition(":")
        names = re.findall(r"``(\w+)``", head)
        assert names, f"floor bullet without ``names`` before its colon: {bullet!r}"
        for name in names:
            assert name not in floor, f"{name} is on two floors of the docstring"
            floor[name] = number
        for shim in re.findall(rf"``python -m {PKG}\.(\w+)``", body):
            floor.setdefault(shim, number)
        match = re.search(r"independent of the (\w+)", bullet)
        if match:
            for name in names:
                independent[name] = match.group(1)
    for name, beside in EXTRA_FLOORS.items():
        floor[name] = floor[beside]
    return Floors(floor, independent)


def _top(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_docstring_lists_the_floors() -> None:
    f = floors()
    for name in ("measure", "options", "batch", "console", "resolvers", "nn", "quantize", "attention"):
        assert name in f.floor, f"{name} missing from the docstring's floors"
    order = ["measure", "nn", "attention", "models", "callbacks", "run", "tools"]
    assert [f.floor[n] for n in order] == sorted({f.floor[n] for n in order}), "docstring floors out of order"
    assert f.independent.get("data") == "models"
    assert f.floor["bench"] == f.floor["analysis"] == f.floor["tools"]
    for name in f.floor:
        assert _resolve(f"{PKG}.{name}") == f"{PKG}.{name}", f"the docstring names {name}, not in {PKG}/"


def test_every_top_level_module_has_a_floor() -> None:
    tops = {_top(m) for m in modules()} - {None}
    missing = sorted(tops - set(floors().floor))
    assert not missing, (
        f"top-level modules on no floor (list them in {PKG}/__init__.py's docstring, or in EXTRA_FLOORS): "
        + ", ".join(missing)
    )


def test_lower_floors_never_import_higher_ones() -> None:
    f = floors().floor
    bad = []
    for e in edges():
        a, b = _top(e.importer), _top(e.imported)
        if a is None or b is None or a == b or (e.importer, e.imported) in ALLOWED_FLOOR_EDGES:
            continue
        if f.get(a, -1) < f.get(b, -1):
            bad.append(
                f"  {e.importer} (floor {f[a]}: {a}) -> {e.imported} (floor {f[b]}: {b})  ({e.where()})"
            )
    assert not bad, "imports of a higher floor:\n" + "\n".join(bad)


def test_floor_zero_imports_nothing_from_the_package() -> None:
    """The docstring's first floor: small shared pieces with no other tvq_exp import."""
    f = floors().floor
    bad = [
        f"  {e.importer} -> {e.imported}  ({e.where()})"
        for e in edges()
        if (a := _top(e.importer)) is not None and f.get(a) == 0 and _top(e.imported) != a
    ]
    assert not bad, "floor-0 modules importing the package:\n" + "\n".join(bad)


def test_independent_packages_stay_out_of_each_others_stack() -> None:
    """``data`` is independent of the models: it imports nothing from the models or the floors they are built
    from (only the shared pieces of floor 0), and the models import nothing from it."""
    f = floors()
    bad = []
    for name, other in f.independent.items():
        stack = {top for top, number in f.floor.items() if 0 < number <= f.floor[other]}
        for e in edges():
            a, b = _top(e.importer), _top(e.imported)
            if (a == name and b in stack) or (a in stack and b == name):
                bad.append(f"  {e.importer} -> {e.imported}  ({e.where()})")
    assert not bad, "imports across independent packages:\n" + "\n".join(bad)


# ---------------------------------------------------------------- size


def _states_why(doc: str) -> bool:
    """A line containing ``Over 300 lines:`` in the docstring's first two paragraphs (the top)."""
    top = "\n\n".join(re.split(r"\n\s*\n", doc)[:2])
    return SIZE_REASON in top


def test_long_modules_state_why() -> None:
    unexplained = []
    for path in modules().values():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_LINES and not _states_why(ast.get_docstring(ast.parse(text)) or ""):
            unexplained.append(f"  {path.relative_to(REPO)}: {lines} lines")
    assert not unexplained, (
        f"modules over {MAX_LINES} lines: split them, or say why not at the top of the module docstring (its "
        f"first two paragraphs), in a line containing {SIZE_REASON!r} and the reason:\n"
        + "\n".join(unexplained)
    )


# ---------------------------------------------------------------- private names


# private names a test may reach, each with the reason; keep it short
ALLOWED_PRIVATE = {
    "bar._get_train_description": "Lightning's own hook name, which the progress bar overrides (tests/callbacks)",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def private_names() -> dict[str, set[str]]:
    """Per module of the package, the private names it defines: module-level functions, classes and variables,
    methods, and attributes it assigns on ``self``."""
    found: dict[str, set[str]] = {}
    for module, path in modules().items():
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
        found[module] = {n for n in names if _is_private(n)}
    return found


def _private_reaches(path: Path, own: set[str]) -> list[str]:
    """Where the file at ``path`` imports a private name from the package, or reads a private attribute that
    some package module defines and this file does not (``self._x``, ``cls._x`` and dunders allowed)."""
    defined_elsewhere = set().union(*private_names().values()) - own
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PKG):
            found += [f"{node.module}.{a.name}" for a in node.names if _is_private(a.name)]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in defined_elsewhere
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            if ast.unparse(node) not in ALLOWED_PRIVATE:
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return [f"  {path.relative_to(REPO)}: {where}" for where in found]


def test_no_private_name_is_reached_across_modules() -> None:
    """A leading-underscore name is its module's own: no other module (nor test) imports it or reads it as an
    attribute. What another module needs is public, and documented."""
    bad = []
    for module, path in modules().items():
        bad += _private_reaches(path, private_names()[module])
    for path in sorted((REPO / "tests").rglob("*.py")):
        bad += _private_reaches(path, set())
    assert not bad, "private names used outside their module:\n" + "\n".join(bad)


def test_private_reaches_are_found(tmp_path: Path) -> None:
    """The checker sees an imported private name and a private attribute defined in another module."""
    some = next(iter(sorted(n for names in private_names().values() for n in names)))
    probe = REPO / "tests" / "_probe_private.py"
    try:
        probe.write_text(f"from tvq_exp.x import _y\nobj.{some}\nself.{some}\n")
        found = _private_reaches(probe, set())
    finally:
        probe.unlink()
    assert len(found) == 2 and "tvq_exp.x._y" in found[0] and some in found[1]


# ---------------------------------------------------------------- attention: one folder per mixer

ATTENTION = PKG_DIR / "attention"
# what the attention package holds besides one folder per mixer: backend-free pieces
ATTENTION_MODULES = {"__init__", "base", "blocked", "flex_runtime", "registry"}
MIXER_FILES = {"__init__.py", "layer.py", "naive.py"}  # and flex.py where the mixer has a flex kernel


def mixers() -> list[str]:
    """The backends' names, as ``BACKENDS`` in ``attention/registry.py`` lists them."""
    tree = ast.parse((ATTENTION / "registry.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and ast.unparse(node.target) == "BACKENDS":
            return sorted(ast.literal_eval(key) for key in node.value.keys)  # type: ignore[union-attr]
    raise AssertionError("no BACKENDS in attention/registry.py")


def test_every_mixer_has_its_folder() -> None:
    """``attention/<name>/`` per backend, with its backend (``layer.py``), its plain reference (``naive.py``) and,
    where it has one, its flex kernel (``flex.py``); every folder with a ``layer.py`` is a backend of the registry;
    beside them only the backend-free modules."""
    names = mixers()
    assert len(names) >= 5
    for name in names:
        folder = ATTENTION / name
        files = {p.name for p in folder.glob("*.py")}
        assert MIXER_FILES <= files, f"attention/{name}/ lacks {sorted(MIXER_FILES - files)}"
    tops = {p.stem for p in ATTENTION.glob("*.py")}
    assert tops <= ATTENTION_MODULES, (
        f"attention/ holds {sorted(tops - ATTENTION_MODULES)}: put it in a mixer's folder"
    )
    folders = {p.parent.name for p in ATTENTION.glob("*/layer.py")}
    assert folders == set(names), f"attention folders with a layer.py {sorted(folders)} != backends {names}"
    packages = {p.parent.name for p in ATTENTION.glob("*/__init__.py")}
    assert packages == folders, f"attention/{sorted(packages - folders)} is no mixer (it has no layer.py)"


def test_the_design_map_matches_the_attention_tree() -> None:
    """docs/design.md §1's map describes the mixer folders generically (``<backend>/``, so a new backend needs no
    edit there) and names every backend-free attention module; any folder or file it names exists."""
    text = (REPO / "docs" / "design.md").read_text()
    line = next(ln for ln in text.splitlines() if "attention/" in ln and "floor 2" in ln)
    start = text.index(line)
    block = text[start : text.index("models/", start)]
    assert "<backend>/" in block and "BACKENDS" in block, (
        "the design map does not describe attention/<backend>/"
    )
    named = set(re.findall(r"\b(\w+)/", block)) - {"attention", "backend"}
    files = set(re.findall(r"\b(\w+\.py)\b", block))
    assert named <= set(mixers()), f"the design map names attention folders {sorted(named - set(mixers()))}"
    tops = {p.name for p in ATTENTION.glob("*.py")} - {"__init__.py"}
    inside = {p.name for p in ATTENTION.glob("*/*.py")}
    assert tops <= files, f"the design map does not name attention/{sorted(tops - files)}"
    assert files <= tops | inside, f"the design map names {sorted(files - tops - inside)}, not in attention/"
