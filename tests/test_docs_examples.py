"""The documented examples whose output the docs show: each marked example runs as a script and prints
the text block that follows it.

A page marks such an example with ``<!-- output checked -->`` right before its ```python block; the
```text block after it is what the example prints (with the pinned torch of constraints.txt, on a
CPU). The expected output is what the docs promise a user who runs the example: these tests keep
the two from drifting apart when the code changes. The words must be the same and every number
the same to 1% (torch's CPU kernels differ by instruction set: AVX2 and AVX-512 machines may round
a last digit differently).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- output checked -->"
EXAMPLE = re.compile(re.escape(MARKER) + r"\s*```python\n(?P<code>.*?)```\s*```text\n(?P<output>.*?)```", re.S)


def checked_examples() -> list:
    """(page:line, code, expected output) of every marked example in README.md and docs/."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        matches = list(EXAMPLE.finditer(text))
        if len(matches) != text.count(MARKER):
            raise AssertionError(f"{page.name}: a {MARKER!r} marker not followed by a python and a text block")
        for m in matches:
            line = text.count("\n", 0, m.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", m.group("code"), m.group("output")))
    return found


EXAMPLES = checked_examples()


def test_the_docs_mark_examples_to_check():
    assert len(EXAMPLES) >= 3, [where for where, *_ in EXAMPLES]


@pytest.mark.parametrize("where, code, expected", EXAMPLES, ids=[where for where, *_ in EXAMPLES])
def test_a_documented_example_prints_what_its_page_shows(tmp_path, where, code, expected):
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{where}: the example failed:\n{run.stderr[-3000:]}"
    got, want = run.stdout.strip("\n"), expected.strip("\n")
    assert _words(got) == _words(want) and _close(_numbers(got), _numbers(want)), \
        f"{where}: the example printed\n{got}"


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _words(text: str) -> list:
    """The lines with every number replaced by one placeholder (trailing spaces dropped)."""
    return [NUMBER.sub("#", line.rstrip()) for line in text.splitlines()]


def _numbers(text: str) -> list:
    return [float(m) for m in NUMBER.findall(text)]


def _close(got: list, want: list) -> bool:
    return len(got) == len(want) and all(abs(g - w) <= 0.01 * abs(w) for g, w in zip(got, want))
