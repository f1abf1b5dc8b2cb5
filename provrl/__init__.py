"""provrl — RL post-training of tool-using LLM agents with exact per-token provenance."""

__version__ = "0.1.0"
