"""The interface every engine mode (ar, chain, tree, async) offers to the CLI, server and bench."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Protocol

from swiftspec.sampling import SamplingParams

if TYPE_CHECKING:
    from swiftspec.tokenizer import Tokenizer


@dataclass(slots=True)
class GenerationStats:
    """Filled in while a request runs; read after its iterator is exhausted."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    rounds: int = 0  # target forwards after prefill
    ttft_s: float = 0.0  # time to first token
    total_s: float = 0.0
    draft_s: float = 0.0  # time spent in draft forwards (serial modes)
    verify_s: float = 0.0  # time spent in target forwards + verification
    accept_lengths: list[int] = field(default_factory=list)  # tokens emitted per target forward

    @property
    def acceptance_length(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0

    @property
    def tokens_per_s(self) -> float:
        decode_s = self.total_s - self.ttft_s
        return (self.new_tokens - 1) / decode_s if self.new_tokens > 1 and decode_s > 0 else 0.0


class Engine(Protocol):
    """Decodes one stream at a time. `generate` yields the tokens of each round as they are final."""

    stats: GenerationStats
    tokenizer: "Tokenizer"  # swiftspec.tokenizer.Tokenizer of the target
    max_seq_len: int  # prompt + new tokens must fit in this

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
    ) -> Iterator[list[int]]:
        """Yield lists of new token ids (one list per round). Stops at EOS (not yielded),
        at max_new_tokens, or once should_stop() returns True (checked once per round)."""
        ...

    def close(self) -> None:
        """Release worker processes and memory."""
        ...
