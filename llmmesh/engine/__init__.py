"""Engine pod plane: vLLM or the simulator behind EngineService."""
