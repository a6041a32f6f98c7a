"""The README opens with exactly two set-up commands, and CI runs the second."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    head = text.split("\n## ", 1)[0]
    return re.findall(r"```(?:bash|sh)\n(.+?)\n```", head, flags=re.S)


def test_readme_starts_with_two_commands() -> None:
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert "llmmesh up" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci


def test_every_python_snippet_of_the_readmes_compiles() -> None:
    """A snippet a reader copies runs as a program: no top-level await, no
    syntax that needs a notebook."""
    readmes = [ROOT / "README.md", *sorted((ROOT / "deploy").rglob("README.md"))]
    snippets = [
        (readme, code)
        for readme in readmes
        for code in re.findall(r"```python\n(.+?)\n```", readme.read_text(), flags=re.S)
    ]
    assert snippets
    for readme, code in snippets:
        compile(code, f"{readme.relative_to(ROOT)} snippet", "exec")
