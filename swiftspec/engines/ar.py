"""Plain autoregressive decoding with the target alone: the reference every other mode must equal."""

from __future__ import annotations

from typing import Callable

from swiftspec.cache.prompt_store import PromptStore
from swiftspec.engines.base import Generation, RequestState, Rounds
from swiftspec.runner.cuda_graph import attach
from swiftspec.runner.model_runner import ModelRunner
from swiftspec.sampling import Draws, SamplingParams, pick_tokens, with_seed
from swiftspec.trace import Timeline, TraceFile, request_trace
from swiftspec.weights.loaded_model import LoadedModel


class AutoregressiveEngine:
    """One target forward per token."""

    fault: str | None = None  # runs in this process alone: nothing to lose

    def __init__(self, target: LoadedModel, max_seq_len: int, store: PromptStore | None = None) -> None:
        """store: the prompt cache's earlier texts (None: only the last text's KV is kept)."""
        self.runner = ModelRunner(target.model, max_seq_len + 1, max_nodes=1, store=store, exact=True)  # + the graphs' scratch slot
        attach(self.runner, (1,))  # a CUDA graph of the one-token step (no-op on CPU)
        self.tokenizer = target.tokenizer
        self.max_seq_len = max_seq_len
        self.trace: TraceFile | None = None  # set while a caller wants each request's timeline
        self.mode = "ar"

    def generate(
        self,
        prompt: list[int],
        params: SamplingParams,
        max_new_tokens: int,
        should_stop: Callable[[], bool] | None = None,
        reuse: bool = True,
    ) -> Generation:
        req = RequestState(prompt, max_new_tokens, self.max_seq_len, self.tokenizer.eos_token_ids, should_stop, reuse)
        return Generation(self._run(req, prompt, params), req.stats)

    @property
    def prompt_store(self) -> PromptStore | None:
        return self.runner.store

    def cached_prefix(self, prompt: list[int]) -> int:
        return self.runner.cached_prefix(prompt)

    def _run(self, req: RequestState, prompt: list[int], params: SamplingParams) -> Rounds:
        params = with_seed(params)  # its draws (sampling.Draws)
        draws = Draws.for_request(params)
        timeline = Timeline()
        try:
            with timeline.span("prefill"):
                logits = req.prefilled(self.runner.prefill(prompt, req.reuse, req.should_stop))  # [1, V]
            if logits is None:
                return
            while True:
                with timeline.span("verify"):
                    token = pick_tokens(logits, params, draws, self.runner.kv.prefix_len)  # [1]
                    out = req.emit(token.tolist())  # the one host sync per step
                timeline.count(len(out), 1)
                req.stats.rounds += 1
                req.stats.accept_lengths.append(1)
                if out:
                    yield out
                if req.done:
                    return
                with timeline.span("forward"):
                    logits = self.runner.extend(out)
        finally:
            if self.trace is not None:
                self.trace.add(request_trace(timeline))

    def recover(self) -> bool:
        return False  # one process: no worker to lose

    def close(self) -> None:
        self.runner = None
