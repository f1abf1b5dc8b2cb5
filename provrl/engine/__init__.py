"""Rollout engine: continuous batching, exact per-token provenance, hot-load."""
