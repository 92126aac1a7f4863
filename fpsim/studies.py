"""Reproducible studies: the registry and runner behind `fpsim study NAME`.

Each study is one script, ``studies/NAME.py`` in the source tree, defining
``TITLE``, ``CLAIM`` (the published claim or question it tests) and
``run(report, fast)``. The runner hands it a `StudyReport`, which saves
figures as PNG under ``OUT/figures/studies/`` and writes the study's page,
``OUT/studies/NAME.md`` (OUT defaults to the repository's ``docs/``). A study
is deterministic: fixed seeds, no clock in its output, so running it again
rewrites the same tables.

    from fpsim import studies
    result = studies.run("format_ranges", fast=True, out="/tmp/docs")
    result.finding, result.figures, result.values

The scripts live in the source tree's top-level ``studies/`` folder and are
installed with fpsim as the package ``fpsim.study_scripts`` (see setup.py),
so a wheel runs them too; it writes under ``./fpsim-studies/`` by default.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import time
from pathlib import Path

STUDIES = ("format_ranges", "gradient_underflow", "loss_scale_sweep", "accumulation_error", "tensorcore_probes",
           "emulated_training", "verdict_agreement")
"""Study names, in the order docs/studies.md presents them."""


class StudyUnavailable(RuntimeError):
    """A study cannot run in this checkout (a part of fpsim it needs is missing)."""


def studies_dir() -> Path:
    """The folder holding the study scripts: the installed package fpsim.study_scripts."""
    spec = importlib.util.find_spec("fpsim.study_scripts")
    if spec is None or not spec.submodule_search_locations:
        raise StudyUnavailable("the study scripts (fpsim.study_scripts) are not installed with this fpsim")
    return Path(list(spec.submodule_search_locations)[0])


def default_out() -> Path:
    """Where studies write by default: the repository's ``docs/`` in a source checkout, else
    ``./fpsim-studies/`` (an installed fpsim has no docs folder of its own)."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "docs" / "studies.md").exists() and (checkout / "studies").is_dir():
        return checkout / "docs"
    return Path.cwd() / "fpsim-studies"


def _script(name: str) -> Path:
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; allowed: {', '.join(STUDIES)}")
    path = studies_dir() / f"{name}.py"
    if not path.exists():
        raise FileNotFoundError(f"study script {path} is missing from this installation of fpsim")
    return path


def load(name: str):
    """The study's module (its TITLE, CLAIM and run)."""
    path = _script(name)
    spec = importlib.util.spec_from_file_location(f"_fpsim_study_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for attr in ("TITLE", "CLAIM", "run"):
        if not hasattr(module, attr):
            raise ValueError(f"study {name} ({path}) defines no {attr}")
    return module


def available() -> list[tuple[str, str]]:
    """(name, title) of every study whose script is present."""
    out = []
    for name in STUDIES:
        try:
            out.append((name, load(name).TITLE))
        except FileNotFoundError:
            continue
    return out


@dataclasses.dataclass
class StudyResult:
    """What one run of a study produced."""

    name: str
    page: Path
    figures: list
    finding: str
    values: dict
    seconds: float
    fast: bool


class StudyReport:
    """Collects one study's text, tables and figures, and writes its Markdown page."""

    def __init__(self, name: str, title: str, claim: str, out, fast: bool):
        self.name, self.title, self.claim, self.fast = name, title, claim, fast
        self.out = Path(out)
        self.figure_dir = self.out / "figures" / "studies"
        self.page = self.out / "studies" / f"{name}.md"
        self.figures: list[Path] = []
        self.values: dict = {}
        self.finding = ""
        self._body: list[str] = []

    # ------------------------------------------------------------- content
    def section(self, heading: str) -> None:
        self._body.append(f"## {heading}\n")

    def text(self, markdown: str) -> None:
        self._body.append(markdown.strip() + "\n")

    def table(self, headers, rows, caption: str | None = None) -> None:
        """A Markdown table; cells are written with str()."""
        headers = [str(h) for h in headers]
        lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
        for row in rows:
            cells = [str(c).replace("|", "\\|").replace("\n", " ") for c in row]
            if len(cells) != len(headers):
                raise ValueError(f"table row {row!r} has {len(cells)} cells for {len(headers)} columns")
            lines.append("| " + " | ".join(cells) + " |")
        if caption:
            self._body.append(f"*{caption.strip()}*\n")
        self._body.append("\n".join(lines) + "\n")

    def figure(self, fig, stem: str, caption: str) -> Path:
        """Save a Figure as OUT/figures/studies/NAME-STEM.png and show it on the page."""
        self.figure_dir.mkdir(parents=True, exist_ok=True)
        path = self.figure_dir / f"{self.name}-{stem}.png"
        fig.savefig(path, dpi=150, metadata={"Software": None})
        self.figures.append(path)
        self._body.append(f"![{self.name} {stem}](../figures/studies/{path.name})\n\n*{caption.strip()}*\n")
        return path

    # --------------------------------------------------------------- output
    def markdown(self) -> str:
        mode = " (fast mode: fewer points, smaller sizes)" if self.fast else ""
        head = [f"# {self.title}\n",
                f"*Generated by `fpsim study {self.name}{' --fast' if self.fast else ''}`{mode}; do not edit by "
                f"hand: the script `studies/{self.name}.py` rewrites this page and its figures.*\n",
                f"**Claim tested.** {self.claim.strip()}\n"]
        if self.finding:
            head.append(f"**Finding.** {self.finding.strip()}\n")
        tail = ["## Regenerate\n",
                f"```\nfpsim study {self.name}            # or: python studies/{self.name}.py\n"
                f"fpsim study {self.name} --fast     # the quick version the test suite runs\n```\n"]
        return "\n".join(head + self._body + tail)

    def write(self) -> Path:
        self.page.parent.mkdir(parents=True, exist_ok=True)
        self.page.write_text(self.markdown(), encoding="utf-8")
        return self.page


def run(name: str, fast: bool = False, out=None) -> StudyResult:
    """Run one study; its page and figures go under `out` (default: the repository's docs/)."""
    module = load(name)
    report = StudyReport(name, module.TITLE, module.CLAIM, default_out() if out is None else out, fast)
    start = time.perf_counter()
    module.run(report, fast)
    page = report.write()
    return StudyResult(name, page, list(report.figures), report.finding, dict(report.values),
                       time.perf_counter() - start, fast)
