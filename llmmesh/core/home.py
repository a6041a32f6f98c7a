"""Where the mesh keeps its local state: ``$LLMMESH_HOME``, default
``~/.llmmesh`` (``mesh.json``, the embedded global store, built models)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def mesh_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$LLMMESH_HOME`` or ``~/.llmmesh``, expanded."""
    env = os.environ if environ is None else environ
    return Path(env.get("LLMMESH_HOME") or "~/.llmmesh").expanduser()
