"""What the vLLM engine's feature settings become on a device, and what a
device cannot do.

Checked against the installed vLLM (0.32, the CPU build here):

- Speculative decoding: ``ngram`` (prompt lookup; vLLM's CPU runner runs its
  numba proposer) and ``draft_model`` (a smaller model with the same
  tokenizer; the CPU runner loads drafters too) become vLLM's
  ``speculative_config``. vLLM then loads no custom logits processor and
  refuses ``logit_bias`` and ``min_p`` (``SamplingParams._validate_spec_decode``),
  so a speculating pod refuses what needs them (:func:`refuse_when_speculating`).
- KV-cache dtype: vLLM's ``CacheDType`` names; on CPU only those its CPU
  attention backend lists (``auto``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``).
- KV offload (``kv_offloading_size``) and weight offload (``cpu_offload_gb``)
  move GPU memory into CPU memory: refused on CPU, where both already live
  there.
- The disaggregated-prefill connector (``kv_transfer_config``: NixlConnector,
  P2pNccl-style and LMCache connectors as vLLM's connector factory names
  them) is written for GPUs and validated by vLLM's ``KVTransferConfig``;
  refused on CPU, where none of them runs.

Everything refused raises :class:`UnsupportedFeature` naming the setting,
before vLLM starts, rather than vLLM failing later or ignoring it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, get_args

from llmmesh.core.errors import InvalidArgument, Reason
from llmmesh.engine.backend import GenerationRequest, SamplingOptions
from llmmesh.engine.settings import EngineSettings

if TYPE_CHECKING:
    from llmmesh.engine.vllm_engine.config import VllmEngineConfig

# The CPU attention backend's supported_kv_cache_dtypes in vLLM 0.32.
CPU_KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


class UnsupportedFeature(ValueError):
    """A feature setting the target device cannot run; ``setting`` names it."""

    def __init__(self, setting: str, message: str) -> None:
        super().__init__(f"{setting}: {message}")
        self.setting = setting


def resolve_device(device: str) -> str:
    """``cpu`` or ``cuda``; ``auto`` asks vLLM which platform it was built for."""
    if device != "auto":
        return device
    try:
        from vllm.platforms import current_platform
    except ImportError:  # no vLLM here: the config is only rendered, for CPU
        return "cpu"
    return "cpu" if current_platform.is_cpu() else "cuda"


def speculative_config(settings: EngineSettings) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``settings``, None when off."""
    method = settings.speculative_method
    if not method:
        return None
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": settings.num_speculative_tokens}
    if method == "ngram":
        config["prompt_lookup_max"] = settings.prompt_lookup_max
        config["prompt_lookup_min"] = settings.prompt_lookup_min
    else:
        config["model"] = settings.speculative_model
    return config


def kv_transfer_config(settings: EngineSettings, device: str) -> dict[str, Any] | None:
    """vLLM's ``KVTransferConfig`` fields for the pod's role, None without
    a connector."""
    from llmmesh.engine.vllm_engine.config import KV_ROLES

    if not settings.kv_connector:
        return None
    return {
        "kv_connector": settings.kv_connector,
        "kv_role": KV_ROLES[settings.pod_role],
        "kv_buffer_device": device,
    }


def check(config: VllmEngineConfig) -> None:
    """Raise :class:`UnsupportedFeature` for what vLLM cannot run on
    ``config.device``; validates the connector with vLLM's own class."""
    if config.device == "cpu":
        if config.kv_cache_dtype not in CPU_KV_CACHE_DTYPES:
            raise UnsupportedFeature(
                "kv_cache_dtype", f"vLLM's CPU attention stores {', '.join(CPU_KV_CACHE_DTYPES)} only"
            )
        if config.kv_offloading_gib:
            raise UnsupportedFeature("kv_offloading_gib", "on CPU the KV cache already lives in CPU memory")
        if config.cpu_offload_gib:
            raise UnsupportedFeature("cpu_offload_gib", "on CPU the weights already live in CPU memory")
        if config.kv_transfer is not None:
            raise UnsupportedFeature(
                "kv_connector", "vLLM's disaggregated-prefill connectors need GPUs (vllm_device=cuda)"
            )
    else:
        from vllm.config.cache import CacheDType

        if config.kv_cache_dtype not in get_args(CacheDType):
            raise UnsupportedFeature(
                "kv_cache_dtype", f"vLLM knows no KV-cache dtype {config.kv_cache_dtype!r}"
            )
    if config.kv_transfer is not None:
        _check_connector(config.kv_transfer)


def _check_connector(fields: dict[str, Any]) -> None:
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    name = fields["kv_connector"]
    known = sorted(KVConnectorFactory._registry)
    if name not in known:
        raise UnsupportedFeature("kv_connector", f"vLLM has no connector {name!r}; it has {', '.join(known)}")
    try:
        KVTransferConfig(**fields)
    except ValueError as exc:
        raise UnsupportedFeature("kv_connector", str(exc)) from exc


def refuse_when_speculating(sampling: SamplingOptions, guided_param: str | None, resumed: bool) -> None:
    """Raise INVALID_ARGUMENT naming the parameter for a request that a
    speculating vLLM engine would serve wrongly or not at all.

    - ``logit_bias``: vLLM refuses it with speculative decoding.
    - Guided decoding (tools, a JSON response format): our guided replies
      bias away tokens holding raw control characters (see
      :mod:`engine.vllm_engine.sampling`), which needs ``logit_bias``;
      without it a reply could hold JSON that strict parsers refuse.
    - A resumed guided reply needs the resumed-grammar logits processor,
      which vLLM does not load when speculating (covered by the above, and
      named here so the message says why).
    """
    if sampling.logit_bias:
        raise _refuse("logit_bias is not available on this pod: it runs speculative decoding", "logit_bias")
    if guided_param is not None:
        why = "continuing a guided reply" if resumed else "guided decoding"
        raise _refuse(
            f"{why} is not available on this pod: it runs speculative decoding, which vLLM "
            "cannot combine with the logits processing guided replies need",
            guided_param,
        )


def _refuse(message: str, param: str) -> InvalidArgument:
    return InvalidArgument(Reason.INVALID_SAMPLING, message, metadata={"param": param})


def refuse_disaggregation(request: GenerationRequest) -> None:
    """The vLLM pods serve whole turns only: their KV connector is written
    for GPUs (:func:`kv_transfer_config`) but the prefill and decode phases
    are not wired to vLLM's ``kv_transfer_params`` yet, so a phase is
    refused rather than run as a whole turn."""
    for param, asked in (
        ("prefill_only", request.prefill_only),
        ("kv_transfer", request.kv_transfer is not None),
    ):
        if asked:
            raise InvalidArgument(
                Reason.INVALID_REQUEST,
                "vLLM pods do not take disaggregated prefill or decode phases; serve them with the simulator "
                "or send whole turns",
                metadata={"param": param},
            )
