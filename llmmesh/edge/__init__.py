"""Edge plane: OpenAI-compatible HTTP and SSE in front of the regions."""
