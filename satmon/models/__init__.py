"""Example models: a GPT-2-style and a LLaMA-style LM with switchable norms."""

from satmon.models.gpt import GPT, GPTConfig
from satmon.models.llama import LlamaConfig, LlamaLM
