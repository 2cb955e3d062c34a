"""The Llama/Qwen2 model runtime: architecture args, layers and the Transformer decoder."""

from swiftspec.model.args import ModelArgs, RopeScaling
from swiftspec.model.transformer import Transformer, WeightLoadError

__all__ = ["ModelArgs", "RopeScaling", "Transformer", "WeightLoadError"]
