"""Inference engines behind the policy endpoint (vLLM, transformers)."""
