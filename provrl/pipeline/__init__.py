"""Orchestration: strict on-policy (sync) and hot-load (async) runs."""
