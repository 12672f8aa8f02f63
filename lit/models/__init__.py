"""Models built from plugins. Single-device PyTorch code: parallelism is applied from outside."""

from lit.models.gpt import GPT
from lit.models.transformer import TransformerConfig, TransformerStack

__all__ = ["GPT", "TransformerConfig", "TransformerStack"]
