"""LoadedModel: what loading a model gives the layers above (runner, speculate, engines): the model ready
to run, its tokenizer, its ModelArgs and the file its weights came from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: importing this module loads no model code
    from swiftspec.model.args import ModelArgs
    from swiftspec.model.transformer import Transformer
    from swiftspec.tokenizer import Tokenizer


@dataclass(slots=True)
class LoadedModel:
    """A model ready to run, with the tokenizer that goes with it."""

    args: ModelArgs
    model: Transformer
    tokenizer: Tokenizer
    path: Path  # the GGUF file or HF directory the weights came from
