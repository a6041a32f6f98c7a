"""One import root: the installed distribution adds only ``llmmesh`` to
``site-packages``, and the planes are its packages."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLANES = ("edge", "region", "globalplane", "engine")


def test_the_installed_distribution_has_one_top_level_name() -> None:
    """What ``pip install`` put into site-packages (not a build's egg-info
    in the checkout): ``top_level.txt``, the files its RECORD lists and, for
    an editable install, the names its finder maps, are ``llmmesh`` alone."""
    site = Path(sysconfig.get_paths()["purelib"])
    (dist,) = (
        d for d in importlib.metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "llmmesh"
    )
    assert (dist.read_text("top_level.txt") or "llmmesh").split() == ["llmmesh"]
    # RECORD also lists the console script (under ../bin) and byte code.
    installed = {Path(str(file)).parts[0] for file in dist.files or ()} - {"..", "__pycache__"}
    editable = {name for name in installed if name.startswith("__editable__")}
    assert {name for name in installed - editable if ".dist-info" not in name} <= {"llmmesh"}
    for finder in (name for name in editable if name.endswith("_finder.py")):
        spec = importlib.util.spec_from_file_location("installed_finder", site / finder)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert set(module.MAPPING) == {"llmmesh"}, module.MAPPING


def test_no_plane_is_importable_by_its_bare_name_outside_the_checkout(tmp_path: Path) -> None:
    """From any directory but the checkout, ``import edge`` finds nothing of
    ours; ``llmmesh.edge`` is the plane."""
    probe = (
        "import importlib.util, sys\n"
        f"planes = {PLANES!r}\n"
        "print([p for p in planes if importlib.util.find_spec(p) is not None])\n"
        "print([p for p in planes if importlib.util.find_spec('llmmesh.' + p) is None])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    bare, missing = result.stdout.splitlines()
    assert bare == "[]", f"importable by a bare name: {bare}"
    assert missing == "[]", f"planes missing from llmmesh: {missing}"


def test_the_top_level_plane_folders_lead_into_the_import_root() -> None:
    for plane in PLANES:
        folder = ROOT / plane
        assert folder.is_symlink(), f"{plane}/ is not a link into llmmesh/"
        assert folder.resolve() == (ROOT / "llmmesh" / plane).resolve()
        assert importlib.util.find_spec(f"llmmesh.{plane}") is not None
