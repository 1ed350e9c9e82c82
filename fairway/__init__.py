"""Fairway: load-aware, prefix-cache-aware ordering of vLLM's waiting queue for LLM prefill."""

__version__ = "0.1.0"
