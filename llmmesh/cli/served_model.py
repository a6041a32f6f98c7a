"""``llmmesh up --engine vllm --model-path DIR``: a local Hugging Face chat
model served through the whole mesh.

The directory is checked before anything starts: it must hold a model
(``config.json``), a tokenizer (``tokenizer.json``, a SentencePiece
``tokenizer.model``, or GPT-2's ``vocab.json`` and ``merges.txt``) and a
chat template (in ``tokenizer_config.json`` or ``chat_template.jinja``),
since every turn is rendered with it. The model is registered under
``--model-name`` (default: the directory's name) as the mesh's default
model, for every tier, so ``auto`` and its name both reach it; its context
window is the model's ``max_position_embeddings``, at most 4,096 tokens (a
pod's KV cache on CPU is sized for that; ``--config`` regions set pods'
settings otherwise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from llmmesh.topology.mesh_config import MeshConfigError

MAX_CONTEXT_WINDOW = 4096
_TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"))


@dataclass(frozen=True)
class ServedModel:
    """A local model directory the mesh's vLLM pods serve, and its name."""

    name: str
    path: Path
    context_window: int

    def pod_env(self) -> dict[str, str]:
        """Environment of a vLLM pod serving it."""
        return {
            "LLMMESH_MODEL": self.name,
            "LLMMESH_MODEL_PATH": str(self.path),
            "LLMMESH_CONTEXT_WINDOW": str(self.context_window),
        }

    def global_env(self) -> dict[str, str]:
        """Environment of the global plane: the model registered as every tier's default."""
        return {
            "LLMMESH_DEFAULT_MODEL": self.name,
            "LLMMESH_DEFAULT_MODEL_CONTEXT_WINDOW": str(self.context_window),
        }


def served_model(path: Path, name: str = "") -> ServedModel:
    """The model in ``path``; MeshConfigError naming what is missing."""
    path = path.expanduser().resolve()
    if not path.is_dir():
        raise MeshConfigError(f"--model-path {path}: no such directory")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise MeshConfigError(f"--model-path {path}: config.json is missing: not a Hugging Face model")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise MeshConfigError(f"--model-path {path}: config.json is unreadable: {err}") from None
    if not any(all((path / f).is_file() for f in files) for files in _TOKENIZER_FILES):
        raise MeshConfigError(
            f"--model-path {path}: no tokenizer (tokenizer.json, tokenizer.model, or vocab.json "
            "with merges.txt)"
        )
    if not _has_chat_template(path):
        raise MeshConfigError(
            f"--model-path {path}: no chat template (tokenizer_config.json's chat_template or "
            "chat_template.jinja): the mesh serves chat models"
        )
    name = name or path.name
    if not name or any(c.isspace() for c in name) or len(name) > 128:
        raise MeshConfigError(f"--model-name {name!r}: 1 to 128 characters without spaces")
    positions = config.get("max_position_embeddings") if isinstance(config, dict) else None
    window = MAX_CONTEXT_WINDOW
    if isinstance(positions, int) and positions > 0:
        window = min(positions, MAX_CONTEXT_WINDOW)
    return ServedModel(name, path, window)


def _has_chat_template(path: Path) -> bool:
    if (path / "chat_template.jinja").is_file():
        return True
    try:
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(tokenizer_config, dict) and bool(tokenizer_config.get("chat_template"))
