"""Example models and data for the demo, the examples and the tests: a GPT-2-style and a LLaMA-style LM
with switchable norms, their Lightning module, and a corpus embedded in Python's standard library."""

from satmon.demos.gpt import GPT, GPTConfig
from satmon.demos.llama import LlamaConfig, LlamaLM

__all__ = ["GPT", "GPTConfig", "LlamaConfig", "LlamaLM"]
