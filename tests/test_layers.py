"""The package's layers import only downward, as /work/shared/DESIGN.md's dependency rules say.

Source of truth: those rules (formats is the ground floor; exact never uses the engine; the
numerics know nothing of training, plotting or the command line; emulate never imports analyze;
analyze does not import integrations; only the cli parses arguments), and /work/shared/STYLE.md's
"private names stay in their module". Every import statement of every module counts, the lazy ones
inside functions included, read from the source with ast: no module imports itself around a loop
(the block-format front doors of quantize/encode/decode excepted, named below), and no module uses
another's private name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fpsim"

NUMERICS = ("fpsim.formats", "fpsim.modes", "fpsim.rounding", "fpsim.codec", "fpsim.blocks", "fpsim.block_codec",
            "fpsim.exact", "fpsim.philox", "fpsim.quotient", "fpsim._arrays", "fpsim._native", "fpsim._options",
            "fpsim.tensorcore")
ABOVE_NUMERICS = ("fpsim.analyze", "fpsim.emulate", "fpsim.integrations", "fpsim.cli", "fpsim.plots", "fpsim.trace",
                  "fpsim.recipes", "fpsim.studies")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every fpsim module `path` imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from . import codec`
    return {m for m in found if m == "fpsim" or m.startswith("fpsim.")}


MODULES = {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def within(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def offenders(importers, forbidden) -> list[str]:
    return sorted(f"{m} imports {i}" for m, found in MODULES.items() if within(m, importers)
                  for i in found if within(i, forbidden))


def test_the_modules_are_found():
    assert {"fpsim.formats", "fpsim.rounding", "fpsim.analyze.report", "fpsim.cli"} <= set(MODULES)


def test_formats_is_the_ground_floor():
    assert MODULES["fpsim.formats"] == set()


def test_exact_never_uses_the_engine_it_checks():
    """The oracle stands on the formats and the mode registry (names and directions: facts, not code)."""
    assert [m for m in MODULES["fpsim.exact"] if not within(m, ("fpsim.formats", "fpsim.modes"))] == []


@pytest.mark.parametrize("importers,forbidden", [
    (NUMERICS, ABOVE_NUMERICS),
    (("fpsim.emulate",), ("fpsim.analyze", "fpsim.integrations", "fpsim.cli")),
    (("fpsim.analyze",), ("fpsim.integrations", "fpsim.cli")),
    (("fpsim.trace", "fpsim.recipes"), ("fpsim.analyze", "fpsim.emulate", "fpsim.integrations", "fpsim.cli")),
], ids=["numerics", "emulate", "analyze", "trace-recipes"])
def test_no_layer_imports_one_above_it(importers, forbidden):
    assert offenders(importers, forbidden) == []


def test_only_the_cli_parses_arguments():
    users = [module_name(p) for p in PACKAGE.rglob("*.py") if "argparse" in {
        alias.name for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.Import) for alias in node.names}]
    assert [m for m in users if not within(m, ("fpsim.cli",))] == []


# ---------------------------------------------------------------- cycles and private names
MODULE_NAMES = set(MODULES) | {f"{module_name(p.parent / '__init__.py')}.{p.stem}" for p in PACKAGE.rglob("_*.c")}
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}
BLOCK_FRONT_DOORS = {("fpsim.rounding", "fpsim.blocks"), ("fpsim.rounding", "fpsim.block_codec"),
                     ("fpsim.codec", "fpsim.blocks"), ("fpsim.codec", "fpsim.block_codec")}
"""The only imports that go up: quantize, encode and decode take block formats by name (DESIGN.md's
contract) and hand them one level up, to fpsim.blocks, from inside the function."""


def node_imports(node, package: str):
    """(imported module, name or None, local name) for each fpsim import of an import statement:
    `from m import x` imports module m.x where that is a module, else the name x of module m."""
    if isinstance(node, ast.Import):
        return [(alias.name, None, alias.asname or alias.name.partition(".")[0]) for alias in node.names
                if alias.name.startswith("fpsim")]
    if node.level:
        base = package.split(".")[:len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    if module != "fpsim" and not module.startswith("fpsim."):
        return []
    return [(f"{module}.{alias.name}", None, alias.asname or alias.name) if f"{module}.{alias.name}" in MODULE_NAMES
            else (module, alias.name, alias.asname or alias.name) for alias in node.names]


def import_edges(path: Path):
    """(imported module, name or None, local name, lazy) for every fpsim import in `path`; a lazy one
    stands inside a function."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    lazy_nodes = {id(inner) for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for inner in ast.walk(node)}
    return [(*entry, id(node) in lazy_nodes) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            for entry in node_imports(node, package)]


EDGES = {module_name(p): list(import_edges(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def import_cycles(graph: dict) -> list:
    """The groups of modules that import each other, directly or around a loop (Tarjan's algorithm)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
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
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_around_a_loop():
    """Lazy imports included: a lower module that borrows a function from one above it (the old
    rounding -> _native -> codec -> rounding) is a layer in the wrong place. Package __init__ files,
    which import their submodules to re-export them, and the block front doors are left out."""
    graph = {m: {target for target, _, _, _ in edges if target in MODULES and target not in PACKAGES and target != m
                 and (m, target) not in BLOCK_FRONT_DOORS}
             for m, edges in EDGES.items() if m not in PACKAGES}
    assert import_cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_block_front_doors_import_up_only_inside_functions():
    upward = sorted((m, target, lazy) for m, edges in EDGES.items() for target, _, _, lazy in edges
                    if (m, target) in BLOCK_FRONT_DOORS)
    assert {(m, target) for m, target, _ in upward} == BLOCK_FRONT_DOORS
    assert [entry for entry in upward if not entry[2]] == []


def test_private_names_stay_in_their_module():
    """STYLE.md: a second module that needs a private name means the name is public or the code is in the
    wrong place. Private modules (_arrays, _native, the C extensions) are the package's own, so they count
    as modules, not as names; what is checked is `from m import _x` and `m._x` for an fpsim module m."""
    def private(name):
        return name.startswith("_") and not name.startswith("__")

    crossing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        edges = EDGES[name]
        crossing += [f"{name} imports {target}.{imported}" for target, imported, _, _ in edges
                     if imported is not None and private(imported)]
        modules = {local: target for target, imported, local, _ in edges if imported is None and target != name}
        crossing += [f"{name} uses {modules[node.value.id]}.{node.attr}"
                     for node in ast.walk(ast.parse(path.read_text(), str(path)))
                     if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                     and node.value.id in modules]
    assert crossing == []


def test_only_the_figure_layer_imports_matplotlib():
    """DESIGN.md: figures are drawn in one layer (fpsim.plots); the report picks their numbers
    (fpsim.analyze.figures) and hands them over, matplotlib unseen."""
    users = sorted({module_name(p) for p in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                    if (isinstance(node, ast.Import) and any(a.name.partition(".")[0] == "matplotlib" for a in node.names))
                    or (isinstance(node, ast.ImportFrom) and (node.module or "").partition(".")[0] == "matplotlib")})
    assert users and [m for m in users if not within(m, ("fpsim.plots",))] == []
