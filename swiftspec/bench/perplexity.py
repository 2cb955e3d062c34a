"""Perplexity of a target's weight formats on a text, windowed as llama.cpp's `llama-perplexity`.

The text is tokenized once and cut into consecutive windows of `n_ctx` tokens (512 by default);
each window is evaluated from an empty cache and only its second half is scored: the logits at
positions n_ctx/2 .. n_ctx-2 predict tokens n_ctx/2+1 .. n_ctx-1, so every scored token has at
least n_ctx/2 tokens of context.  Perplexity is exp(mean negative log-likelihood) over all scored
tokens.  The same token windows go to every format and to llama.cpp (on the GGUF file itself), so
the figures compare the weights alone.

Formats: "file" is the checkpoint dequantized to fp32 with fp32 activations (the reference), and
bf16 / int8 / int4 / gguf are SwiftSpec's --weights formats with bf16 activations, run through the same
kernels as decoding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from swiftspec.config import WEIGHT_FORMATS, LoadConfig
from swiftspec.errors import UserError
from swiftspec.runner.load import load_target
from swiftspec.weights.bundled import DEFAULT_TARGET
from swiftspec.weights.loader import load_tokenizer
from swiftspec.weights.source import resolve_source

REFERENCE = "file"  # the checkpoint dequantized, fp32 activations


@dataclass(frozen=True, slots=True)
class Perplexity:
    """One weight format's perplexity on the windows."""

    label: str  # a format name, or "llama.cpp"
    ppl: float
    n_ctx: int
    windows: int
    scored_tokens: int
    window_ppl: list[float]  # per window, to show the spread

    def to_json(self) -> dict:
        return asdict(self)


def token_windows(ids: list[int], n_ctx: int, count: int) -> list[list[int]]:
    """The first `count` whole windows of n_ctx tokens (UserError if the text is too short)."""
    if n_ctx < 8 or n_ctx % 2:
        raise UserError(f"perplexity windows must be an even number of tokens >= 8, got {n_ctx}")
    have = len(ids) // n_ctx
    if have < count:
        raise UserError(f"the text has {len(ids)} tokens: {have} windows of {n_ctx}, fewer than the {count} asked")
    return [ids[i * n_ctx : (i + 1) * n_ctx] for i in range(count)]


def _scored(window_logits: list[torch.Tensor], windows: list[list[int]], label: str) -> Perplexity:
    """window_logits[i] [n_ctx/2 - 1, vocab]: the logits at positions n_ctx/2 .. n_ctx-2."""
    nlls = []
    for logits, w in zip(window_logits, windows):
        first = len(w) // 2
        targets = torch.tensor(w[first + 1 :])
        nlls.append(F.cross_entropy(logits.float(), targets, reduction="none"))  # [n_ctx/2 - 1]
    flat = torch.cat(nlls)
    return Perplexity(label=label, ppl=math.exp(float(flat.mean())), n_ctx=len(windows[0]), windows=len(windows),
                      scored_tokens=flat.numel(), window_ppl=[math.exp(float(n.mean())) for n in nlls])


def load_for(source: str, fmt: str, device: str = "cpu"):
    """The target model as `fmt` runs it (the runtime's own loading and packing)."""
    if fmt == REFERENCE:
        return load_target(source, LoadConfig(device=device, dtype="float32", weights="bf16")).model
    return load_target(source, LoadConfig(device=device, dtype="bfloat16", weights=fmt)).model


@torch.inference_mode()
def swiftspec_perplexity(model, windows: list[list[int]], label: str) -> Perplexity:
    """Each window through `model` (a Transformer) from an empty cache, second half scored."""
    out = []
    for w in windows:
        n, first = len(w), len(w) // 2
        cache = model.new_cache(n)
        pos = torch.arange(n)
        hidden = model(torch.tensor(w), pos, cache, pos, torch.ones(n, n, dtype=torch.bool).tril())  # [n, hidden]
        out.append(model.logits(hidden[first : n - 1]))  # [n/2 - 1, vocab]
    return _scored(out, windows, label)


def llamacpp_perplexity(gguf: Path, windows: list[list[int]], threads: int) -> Perplexity:
    """The same windows through llama.cpp (llama-cpp-python) on the GGUF file itself."""
    from llama_cpp import Llama

    n = len(windows[0])
    llm = Llama(model_path=str(gguf), n_ctx=n, n_batch=n, logits_all=True, n_threads=threads, verbose=False)
    try:
        out = []
        for w in windows:
            llm.reset()
            llm.eval(w)
            out.append(torch.from_numpy(llm.scores[n // 2 : n - 1].copy()))  # [n/2 - 1, vocab]
        return _scored(out, windows, "llama.cpp")
    finally:
        llm.close()


def markdown(rows: list[Perplexity], text: str) -> list[str]:
    """A report section: perplexity per format and its difference from the fp32 reference."""
    ref = next((r.ppl for r in rows if r.label == REFERENCE), None)
    r0 = rows[0]
    lines = [f"Perplexity on `{text}`: {r0.windows} windows of {r0.n_ctx} tokens, the second half of each "
             f"scored ({r0.scored_tokens} tokens), as llama-perplexity does.", "",
             "| weights | perplexity | vs file fp32 |", "|---|---|---|"]
    for r in rows:
        delta = f"{100 * (r.ppl / ref - 1):+.2f}%" if ref else "—"
        lines.append(f"| {r.label} | {r.ppl:.4f} | {delta} |")
    return lines


def add_arguments(parser) -> None:  # noqa: ANN001 - argparse parser

    parser.add_argument("text", help="a UTF-8 text file")
    parser.add_argument("--model", default=DEFAULT_TARGET, help="bundled name, .gguf path or HF directory")
    parser.add_argument("--formats", default=f"{REFERENCE},bf16,int8,int4",
                        help=f"comma list of {REFERENCE} (fp32 dequantized), bf16, int8, int4, gguf")
    parser.add_argument("--windows", type=int, default=4, help="number of windows (default 4)")
    parser.add_argument("--ctx", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--llama", action="store_true", help="also llama.cpp on the GGUF file (llama-cpp-python)")


def measure(source: str, text_file: str, formats: list[str], n_ctx: int, count: int, llama: bool,
            threads: int) -> list[Perplexity]:
    """Perplexity of each format (and of llama.cpp on a GGUF) on the first `count` windows of the text."""
    bad = [f for f in formats if f not in (REFERENCE, *WEIGHT_FORMATS)]
    if bad:
        raise UserError(f"unknown weight format(s) {', '.join(bad)} for perplexity")
    try:
        text = Path(text_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {text_file}: {e}") from None
    path = resolve_source(source)
    windows = token_windows(load_tokenizer(path).encode(text), n_ctx, count)
    rows = []
    for fmt in formats:
        model = load_for(str(path), fmt)
        rows.append(swiftspec_perplexity(model, windows, fmt))
        del model
    if llama:
        if path.suffix != ".gguf":
            raise UserError("--llama needs a GGUF model")
        rows.append(llamacpp_perplexity(path, windows, threads))
    return rows


def for_bench(source: str, text_file: str, formats: list[str], llama: bool, windows: int,
              threads: int) -> dict[str, dict]:
    """The bench's quality column: the file in fp32, each weight format the run used and llama.cpp
    (where its peer ran on a GGUF), keyed by label."""
    llama = llama and resolve_source(source).suffix == ".gguf"
    rows = measure(source, text_file, [REFERENCE, *formats], 512, windows, llama, threads)
    return {r.label: r.to_json() for r in rows}


def run(args) -> int:  # noqa: ANN001 - argparse namespace
    """`swiftspec perplexity`: one table on stdout."""
    rows = measure(args.model, args.text, [f.strip() for f in args.formats.split(",") if f.strip()], args.ctx,
                   args.windows, args.llama, torch.get_num_threads())
    print("\n".join(markdown(rows, args.text)))
    return 0
