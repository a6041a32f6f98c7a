"""The vLLM backend: ``vllm.v1`` ``AsyncLLM`` behind :class:`engine.backend.EngineBackend`.

vLLM, torch and transformers come with the ``vllm`` extra and are imported
only when this backend starts, so the simulator runs without them.
"""
