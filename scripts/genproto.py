"""Generate the Python modules and typed stubs of the protobuf contract.

The output is committed under ``llmmesh/v1/``; ``tests/test_generated.py``
regenerates it into a temporary folder and fails when the committed copy is
stale. Run ``python scripts/genproto.py`` after editing ``protos/``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path("llmmesh") / "v1"
INIT_TEXT = '"""Generated protobuf modules of package llmmesh.v1 (scripts/genproto.py)."""\n'


def generate(out_root: Path) -> list[Path]:
    """Write the generated package under ``out_root`` and return its files."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    bindir = Path(sys.executable).parent
    well_known = str(resources.files("grpc_tools") / "_proto")
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out_root}",
        f"--grpc_python_out={out_root}",
        f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
        f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
        f"--mypy_out={out_root}",
        f"--mypy_grpc_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    package = out_root / PACKAGE_DIR
    (package / "__init__.py").write_text(INIT_TEXT)
    (package / "py.typed").write_text("")
    return sorted(package.iterdir())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write llmmesh/v1 under")
    args = parser.parse_args()
    target = args.out / PACKAGE_DIR
    with tempfile.TemporaryDirectory() as tmp:
        files = generate(Path(tmp))
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for f in files:
            shutil.copy2(f, target / f.name)
    print(f"generated {len(files)} files in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
