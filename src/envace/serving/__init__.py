"""envace serve: the OpenAI-compatible server."""
