"""The shape the region's turn keeps: a thin gateway over its stages, no
class that takes more than eight constructor parameters, and no
collaborator handed to an object after it was built (an object is whole
when its constructor returns). Read from the source, so it runs in no time."""

from __future__ import annotations

import ast
import functools
import pickle
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmmesh"
MAX_PARAMETERS = 8
# Assembled object by object where the rule against late wiring applies: every plane.
PLANES = ("region", "edge", "engine", "globalplane")


def modules(*parts: str) -> Iterator[Path]:
    for path in sorted(PACKAGE.joinpath(*parts).rglob("*.py")):
        if "v1" not in path.relative_to(PACKAGE).parts[:1]:
            yield path


_PARSE = "import ast, pickle, sys; sources = pickle.load(sys.stdin.buffer); " + (
    "pickle.dump({key: ast.parse(text) for key, text in sources.items()}, sys.stdout.buffer)"
)


def parsed(sources: Mapping[str, str]) -> dict[str, ast.Module]:
    """Each source parsed, in an interpreter of its own: in a test process
    shared with other tests, CPython 3.11's parser can be left refusing
    every later parse ("AST constructor recursion depth mismatch") by a
    recursion error elsewhere in the process."""
    done = subprocess.run(
        [sys.executable, "-c", _PARSE], input=pickle.dumps(dict(sources)), capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    trees: dict[str, ast.Module] = pickle.loads(done.stdout)
    return trees


@functools.cache
def _package_trees() -> dict[Path, ast.Module]:
    paths = list(modules())
    trees = parsed({str(path): path.read_text() for path in paths})
    return {path: trees[str(path)] for path in paths}


def tree_of(path: Path) -> ast.Module:
    """The syntax tree of one of the package's modules."""
    return _package_trees()[path]


def constructor_parameters(tree: ast.Module) -> Iterator[tuple[str, int, int]]:
    """(class, line, parameters) of each explicit ``__init__`` (``self`` not
    counted), and of each dataclass that owns running parts (it has a
    ``stop`` or ``close``: a running plane, not a value), by its fields
    (those with ``init=False`` are no parameters)."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        methods = {
            item.name for item in node.body if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                args = item.args
                count = len(args.posonlyargs) + len(args.args) - 1 + len(args.kwonlyargs)
                yield node.name, item.lineno, count
        dataclass = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
        if dataclass and methods & {"stop", "close"}:
            fields = [
                item
                for item in node.body
                if isinstance(item, ast.AnnAssign)
                and not (item.value is not None and "init=False" in ast.unparse(item.value))
            ]
            yield node.name, node.lineno, len(fields)


def our_classes() -> set[str]:
    """The names of every class the package defines."""
    return {
        node.name for path in modules() for node in ast.walk(tree_of(path)) if isinstance(node, ast.ClassDef)
    }


def _callee(value: ast.expr) -> str:
    """The class or function name ``value`` calls ("" when it is no call)."""
    if not isinstance(value, ast.Call):
        return ""
    callee = value.func
    if isinstance(callee, ast.Name):
        return callee.id
    if isinstance(callee, ast.Attribute):
        # A generated protobuf message (``chat_service_pb2.ChatStart()``) is filled in field by field.
        module = callee.value.id if isinstance(callee.value, ast.Name) else ""
        return "" if module.endswith(("_pb2", "pb")) else callee.attr
    return ""


def late_wiring(tree: ast.Module, ours: set[str]) -> Iterator[tuple[int, str]]:
    """In one function, a collaborator (an object it constructs, or one it
    holds by name) assigned to an attribute of an object of one of ``ours``
    that the same function constructed: ``gateway = ChatGateway(...);
    gateway.memory = UserMemory(...)``. State (``hold.released = True``,
    ``plan.duration_s = self.step_s()``) is not wiring."""
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        built: set[str] = set()
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and _callee(node.value) in ours:
                built.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for node in ast.walk(func):
            if not isinstance(node, ast.Assign):
                continue
            collaborator = isinstance(node.value, ast.Name) or _callee(node.value)[:1].isupper()
            for target in node.targets:
                if (
                    collaborator
                    and isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in built
                ):
                    yield node.lineno, ast.unparse(target)


def test_no_class_takes_more_than_eight_constructor_parameters() -> None:
    wide = [
        f"{path.relative_to(ROOT)}:{line} {name} takes {count}"
        for path in modules()
        for name, line, count in constructor_parameters(tree_of(path))
        if count > MAX_PARAMETERS
    ]
    assert wide == []


def test_no_plane_hands_an_object_a_collaborator_after_building_it() -> None:
    ours = our_classes()
    late = [
        f"{path.relative_to(ROOT)}:{line} {target}"
        for plane in PLANES
        for path in modules(plane)
        for line, target in late_wiring(tree_of(path), ours)
    ]
    assert late == []


def test_the_gateway_is_a_thin_sequence_of_stages() -> None:
    gateway = PACKAGE / "region" / "gateway.py"
    assert len(gateway.read_text().splitlines()) < 300
    stages = {"prepare", "admit", "place", "stream", "record"}
    present = {path.stem for path in (PACKAGE / "region" / "turn").glob("*.py")}
    assert stages <= present, stages - present


def test_the_checks_can_fail() -> None:
    running = "".join(f"    part{n}: int\n" for n in range(9))
    value = "".join(f"    field{n}: int\n" for n in range(12))
    source = (
        "class Wide:\n    def __init__(self, a, b, c, d, e, f, g, h, i): ...\n"
        f"@dataclass\nclass Running:\n{running}    async def stop(self) -> None: ...\n"
        f"@dataclass\nclass Value:\n{value}"
        "async def wire(retries):\n    gateway = ChatGateway(1)\n    gateway.memory = UserMemory()\n"
        "    gateway.retries = retries\n    gateway.started = True\n"
        "def message():\n    start = chat_service_pb2.ChatStart()\n    start.model = Model()\n"
    )
    tree = parsed({"source": source})["source"]
    counted = [(name, count) for name, _, count in constructor_parameters(tree)]
    assert counted == [("Wide", 9), ("Running", 9)]
    ours = {"ChatGateway", "UserMemory"}
    assert [target for _, target in late_wiring(tree, ours)] == ["gateway.memory", "gateway.retries"]
