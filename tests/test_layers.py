"""The package's layers import only downward, as /work/shared/DESIGN.md's dependency rules say.

Source of truth: those rules (formats is the ground floor; exact never uses the engine; the
numerics know nothing of training, plotting or the command line; emulate never imports analyze;
analyze does not import integrations; only the cli parses arguments). Every import statement
of every module counts, the lazy ones inside functions included, read from the source with ast.
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
