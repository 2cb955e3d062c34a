"""Peers: llama.cpp on the same GGUF files, through llama-cpp-python or a `llama-server` binary, and
ik_llama.cpp (a llama.cpp fork with its own CPU kernels) through its `llama-server`.

llamacpp-ar is plain decoding. llamacpp-spec is speculative decoding with the real draft model:
natively in llama-server (`-md`), or in llama-cpp-python through its LlamaDraftModel hook, filled by
a second Llama instance of the draft that proposes `k` greedy tokens per round.  ikllama-ar and
ikllama-spec run ik_llama.cpp's server with its fastest CPU setting (IK_FLAGS), built for this CPU
by tools/build_ikllama.py (`make install-ikllama`), which records where in ik_server_record().
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import numpy as np

from swiftspec.bench.harness import RunResult
from swiftspec.errors import UserError
from swiftspec.kernels.cpu_ext import cache_dir

try:
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaDraftModel as _DraftBase
except ImportError:
    Llama = None
    _DraftBase = object

_SERVER_START_S = 300.0  # loading a GGUF on a busy machine can be slow
IK_FLAGS = ("-rtr",)  # run-time repacking into its interleaved CPU layouts (flash attention is on by default)


def llama_cpp_available() -> bool:
    return Llama is not None


def llama_cpp_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


def ik_server_record() -> Path:
    """The file that names ik_llama.cpp's llama-server built for this CPU at the SWIFTSPEC_ISA cap in force
    (one per cap, so an AVX2-only build can sit beside the native one)."""
    cap = os.environ.get("SWIFTSPEC_ISA", "").strip().lower() or "native"
    return cache_dir() / "ikllama" / f"llama-server-{cap}.path"


def ik_llama_server() -> str | None:
    """The recorded ik_llama.cpp llama-server for this CPU, if it was built and still exists."""
    record = ik_server_record()
    path = record.read_text().strip() if record.is_file() else ""
    return path if path and Path(path).is_file() else None


def _clip(tokens: list[int], eos_ids: frozenset[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[:i]
    return tokens


class _DraftProposer(_DraftBase):
    """llama-cpp-python's draft hook backed by a real draft model: `k` greedy tokens per call.

    The draft Llama keeps its KV cache between calls; `generate` re-evaluates only the suffix
    that differs from the last call (the newly verified tokens).
    """

    def __init__(self, draft: "Llama", k: int) -> None:
        self.draft = draft
        self.k = k
        self.calls = 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs: object) -> np.ndarray:
        self.calls += 1
        out: list[int] = []
        for token in self.draft.generate(input_ids.tolist(), temp=0.0, top_k=1, top_p=1.0, min_p=0.0):
            out.append(token)
            if len(out) == self.k:
                break
        return np.array(out, dtype=np.intc)


class LlamaPyRunner:
    """llama-cpp-python: `Llama.generate` token by token, plus the draft hook for speculation."""

    def __init__(self, target: Path, threads: int, n_ctx: int, eos_ids: frozenset[int], sampling: tuple[float, float],
                 draft: Path | None = None, draft_k: int = 4) -> None:
        common = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.proposer = _DraftProposer(Llama(str(draft), **common), draft_k) if draft else None
        self.llm = Llama(str(target), draft_model=self.proposer, **common)
        self.eos_ids = eos_ids
        self.temperature, self.top_p = sampling

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult:
        self.llm.reset()  # no prompt-cache reuse between runs: every run pays its prefill
        self.llm.set_seed(seed)
        if self.proposer is not None:
            self.proposer.draft.reset()
            self.proposer.calls = 0
        tokens: list[int] = []
        start = time.perf_counter()
        ttft = 0.0
        sampling = dict(temp=self.temperature, top_k=0, top_p=self.top_p, min_p=0.0, repeat_penalty=1.0)
        for token in self.llm.generate(prompt, **sampling):
            if not tokens:
                ttft = time.perf_counter() - start
            if token in self.eos_ids:
                break
            tokens.append(token)
            if len(tokens) == max_new_tokens:
                break
        total = time.perf_counter() - start
        if self.proposer is None:
            return RunResult(tokens=tokens, ttft_s=ttft, total_s=total, rounds=len(tokens), round_tokens=len(tokens))
        calls = self.proposer.calls  # one draft call per target forward after the prefill
        return RunResult(tokens=tokens, ttft_s=ttft, total_s=total, rounds=calls,
                         round_tokens=max(len(tokens) - 1, 0), draft_forwards=calls * self.proposer.k)

    def close(self) -> None:
        self.llm.close()
        if self.proposer is not None:
            self.proposer.draft.close()


class LlamaServerRunner:
    """A `llama-server` child on a loopback port; `-md` adds its native speculative decoding.

    Times are the server's own (`timings.prompt_ms` / `predicted_ms`), so HTTP overhead is excluded.
    A server that returns no token ids (ik_llama.cpp's) has its text encoded by `encode`.
    """

    def __init__(self, binary: str, target: Path, threads: int, n_ctx: int, eos_ids: frozenset[int],
                 sampling: tuple[float, float], log: Path, draft: Path | None = None,
                 extra: tuple[str, ...] = (), encode: Callable[[str], list[int]] | None = None) -> None:
        """sampling: (temperature, top-p); extra: more server flags."""
        self.port = _free_port()
        cmd = [binary, "-m", str(target), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", "1", *extra]
        self.encode = encode
        if draft is not None:
            cmd += ["-md", str(draft)] + _draft_type_args(binary)
        self.log = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
        self.eos_ids = eos_ids
        self.temperature, self.top_p = sampling
        self.speculative = draft is not None
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _SERVER_START_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"llama-server exited with code {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.close()
        raise UserError(f"llama-server did not become ready in {_SERVER_START_S:.0f} s; see {self.log}")

    def generate(self, prompt: list[int], max_new_tokens: int, seed: int) -> RunResult:
        body = {"prompt": prompt, "n_predict": max_new_tokens, "temperature": self.temperature, "top_k": 0,
                "top_p": self.top_p, "min_p": 0.0, "repeat_penalty": 1.0, "seed": seed, "cache_prompt": False,
                "return_tokens": True, "stream": False}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            res = json.loads(r.read())
        t = res["timings"]
        ids = res["tokens"] if "tokens" in res or self.encode is None else self.encode(res.get("content", ""))
        tokens = _clip(list(ids), self.eos_ids)
        ttft = t["prompt_ms"] / 1000
        total = ttft + t["predicted_ms"] / 1000
        if not self.speculative:
            return RunResult(tokens=tokens, ttft_s=ttft, total_s=total, rounds=len(tokens), round_tokens=len(tokens))
        accepted = int(t.get("draft_n_accepted", 0))
        after_first = max(len(tokens) - 1, 0)  # each round after the prefill emits accepted + 1 tokens
        return RunResult(tokens=tokens, ttft_s=ttft, total_s=total, rounds=max(after_first - accepted, 1),
                         round_tokens=after_first, draft_forwards=int(t.get("draft_n", 0)))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _draft_type_args(binary: str) -> list[str]:
    """Newer llama-server builds draft only when asked (`--spec-type draft-simple`); older ones draft
    whenever `-md` is given and do not know the flag."""
    try:
        help_text = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return ["--spec-type", "draft-simple"] if "draft-simple" in help_text else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
