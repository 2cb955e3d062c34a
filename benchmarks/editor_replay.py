"""Replay an editor session and a chat against our server and llama-server, both with their prompt
caches on, interleaved request by request; report TTFT, total latency and prompt tokens read.

Editor: llama.vim's /infill pattern on real third-party files (installed packages, not the repo's
datasets): the user is typing the file's line at the cursor: the prefix is the lines before it (from
the first line: the cursor stays within llama.vim's 256-line prefix window) and that line's
indentation, the suffix the 64 lines after it; each request finds that line typed and the cursor one
line down, and asks for 32 greedy tokens.  Chat: 8 turns through /v1/chat/completions, streamed, greedy, 96 tokens a turn.
With --check-cold, each editor request is sent to our server again with cache_prompt false: the
completions must be equal.

Run: .venv/bin/python benchmarks/editor_replay.py --mode tree --out /tmp/prompt-cache/RUN (its figures go into
docs/bench/README.md#editor and docs/bench/history.jsonl)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

FILES = ("uvicorn/protocols/http/h11_impl.py", "starlette/responses.py", "prometheus_client/metrics.py")
N_PREFIX, N_SUFFIX = 256, 64  # llama.vim's defaults (lines)
CHAT = ["Write a Python function that checks whether a string is a palindrome.",
        "Now make it ignore case and punctuation.", "Add type hints and a docstring.",
        "Write three pytest tests for it.", "Make the tests parametrized.",
        "Now write the same function in JavaScript.", "Explain the time complexity of both versions.",
        "Rewrite the Python version without slicing."]


@dataclass
class Row:
    server: str
    workload: str  # file name, or "chat"
    request: int
    ttft_s: float
    total_s: float
    prompt_tokens: int  # the prompt's length
    read_tokens: int  # prompt tokens the server computed (not from its cache)
    content: str = field(repr=False, default="")
    accept: float = 0.0  # our tokens per target forward, from /metrics deltas (0 for the peer)


def find_file(relative: str) -> Path:
    top = relative.split("/")[0]
    spec = importlib.util.find_spec(top)
    return Path(spec.origin).parent.parent / relative


def infill_body(lines: list[str], cursor: int, cache: bool = True) -> dict:
    """The user is about to type line `cursor` (its indentation typed): the lines before it are the
    prefix, the 64 after it the suffix; the next request finds that line typed, the cursor below."""
    line = lines[cursor]
    indent = line[: len(line) - len(line.lstrip())]
    # the typed indentation ends the prefix: ik_llama.cpp's /infill runs a non-empty `prompt` as a
    # completion task of its own, which overwrites its slot's cache (llama.vim's own server would not)
    return {"input_prefix": "".join(lines[max(0, cursor - N_PREFIX):cursor]) + indent, "prompt": "",
            "input_suffix": "\n" + "".join(lines[cursor + 1: cursor + 1 + N_SUFFIX]),
            "input_extra": [], "n_predict": 32, "temperature": 0.0, "cache_prompt": cache,
            "stream": True, "t_max_predict_ms": 0}


def as_completion(body: dict) -> dict:
    """The same FIM prompt for llama-server's /completion, spelled out as llama.cpp's /infill (and
    ours) lays it out for Qwen2.5-Coder: ik_llama.cpp's /infill answers with empty content."""
    prompt = (f"<|repo_name|>myproject\n<|file_sep|>filename\n<|fim_prefix|>{body['input_prefix']}{body['prompt']}"
              f"<|fim_suffix|>{body['input_suffix']}<|fim_middle|>")
    keep = ("n_predict", "temperature", "cache_prompt", "stream")
    return {"prompt": prompt, **{k: body[k] for k in keep}}


def stream_infill(url: str, body: dict, peer: bool = False) -> tuple[float, float, str, dict]:
    start = time.perf_counter()
    first, text, last = None, [], {}
    path, body = ("/completion", as_completion(body)) if peer else ("/infill", body)
    with httpx.stream("POST", url + path, json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("content"):
                first = first or time.perf_counter()
                text.append(event["content"])
            if event.get("stop"):
                last = event
    end = time.perf_counter()
    return (first or end) - start, end - start, "".join(text), last


def stream_chat(url: str, messages: list[dict]) -> tuple[float, float, str, dict]:
    body = {"messages": messages, "max_tokens": 96, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, text, usage = None, [], {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    return (first or end) - start, end - start, "".join(text), usage


def accept_totals(url: str) -> tuple[float, float]:
    """(sum, count) of our swiftspec_acceptance_length histogram."""
    text = httpx.get(url + "/metrics", timeout=30).text
    values = dict(re.findall(r"^swiftspec_acceptance_length_(sum|count) ([0-9.e+]+)$", text, re.M))
    return float(values.get("sum", 0)), float(values.get("count", 0))


def start_ours(args: argparse.Namespace, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "swiftspec.cli", "serve", "--mode", args.mode, "--port", str(port),
           "--max-tokens", "128", *args.ours_flag]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(args.out / "ours.log", "w"))


def start_peer(args: argparse.Namespace, port: int) -> subprocess.Popen:
    from swiftspec.bench.peers_llamacpp import IK_FLAGS, ik_llama_server
    from swiftspec.weights.bundled import BUNDLED, DEFAULT_TARGET, cache_dir, model_path

    binary = args.llama_server or ik_llama_server()
    if binary is None:
        raise SystemExit("no llama-server: run `make install-ikllama` or pass --llama-server")
    cmd = [binary, "-m", str(model_path(BUNDLED[DEFAULT_TARGET], cache_dir())), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(os.cpu_count()), "-tb", str(os.cpu_count()), "-c", "8192", "-np", "1", *IK_FLAGS]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(args.out / "peer.log", "w"))


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server at {url} exited ({proc.returncode})")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"the server at {url} did not become ready")


def replay(args: argparse.Namespace, servers: dict[str, str]) -> list[Row]:
    rows: list[Row] = []
    for relative in FILES[: args.files]:
        lines = find_file(relative).read_text().splitlines(keepends=True)
        start = min(N_PREFIX - args.requests, len(lines) - N_SUFFIX - args.requests - 1)
        for k in range(args.requests):
            body = infill_body(lines, start + k)
            for name, url in servers.items():
                before = accept_totals(url) if name == "ours" else (0.0, 0.0)
                ttft, total, text, last = stream_infill(url, body, peer=name == "peer")
                after = accept_totals(url) if name == "ours" else (0.0, 1.0)
                timings = last.get("timings", {})
                accept = (after[0] - before[0]) / max(1.0, after[1] - before[1]) if name == "ours" else 0.0
                rows.append(Row(name, Path(relative).name, k + 1, ttft, total,
                                int(last.get("tokens_evaluated", 0)), int(timings.get("prompt_n", 0)), text, accept))
                print(f"{name:5} {Path(relative).name:16} req {k + 1}: ttft {ttft:6.2f} s total {total:6.2f} s "
                      f"read {rows[-1].read_tokens:5d}/{rows[-1].prompt_tokens:5d} accept {accept:.2f}", flush=True)
        for name, url in servers.items():  # the last request again, unchanged (llama.vim re-asks on a pause)
            ttft, total, text, last = stream_infill(url, body, peer=name == "peer")
            rows.append(Row(name, "identical", len(rows), ttft, total, int(last.get("tokens_evaluated", 0)),
                            int(last.get("timings", {}).get("prompt_n", 0)), text))
            print(f"{name:5} identical prompt: ttft {ttft:6.3f} s total {total:6.2f} s", flush=True)
    return rows


def chat(servers: dict[str, str]) -> list[Row]:
    rows: list[Row] = []
    history = {name: [] for name in servers}
    for turn, question in enumerate(CHAT, 1):
        for name, url in servers.items():
            messages = history[name] + [{"role": "user", "content": question}]
            ttft, total, text, usage = stream_chat(url, messages)
            history[name] = messages + [{"role": "assistant", "content": text}]
            prompt = int(usage.get("prompt_tokens", 0))
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
            rows.append(Row(name, "chat", turn, ttft, total, prompt, prompt - cached, text))
            print(f"{name:5} chat turn {turn}: ttft {ttft:6.2f} s total {total:6.2f} s cached {cached}/{prompt}",
                  flush=True)
    return rows


def check_cold(url: str, rows: list[Row], args: argparse.Namespace) -> list[bool]:
    """Each editor request again, with cache_prompt false: the same completion?"""
    same = []
    for relative in FILES[: args.files]:
        lines = find_file(relative).read_text().splitlines(keepends=True)
        start = min(N_PREFIX - args.requests, len(lines) - N_SUFFIX - args.requests - 1)
        for k in range(args.requests):
            cold = stream_infill(url, infill_body(lines, start + k, cache=False))[2]
            warm = next(r.content for r in rows if r.server == "ours" and r.workload == Path(relative).name
                        and r.request == k + 1)
            same.append(cold == warm)
            print(f"cold check {Path(relative).name} req {k + 1}: {'same' if cold == warm else 'DIFFERENT'}", flush=True)
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="auto")
    parser.add_argument("--files", type=int, default=3)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-chat", action="store_true")
    parser.add_argument("--check-cold", action="store_true")
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--ours-flag", action="append", default=[], help="one more `swiftspec serve` flag (repeat)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    procs, servers = [], {}
    try:
        procs.append(start_ours(args, 18080))
        servers["ours"] = "http://127.0.0.1:18080"
        if not args.no_peer:
            procs.append(start_peer(args, 18081))
            servers["peer"] = "http://127.0.0.1:18081"
        for proc, url in zip(procs, servers.values()):
            wait_ready(url, proc)
        rows = replay(args, servers)
        (args.out / "replay.json").write_text(json.dumps({"rows": [asdict(r) for r in rows]}, indent=1))
        rows += [] if args.no_chat else chat(servers)
        same = check_cold(servers["ours"], rows, args) if args.check_cold else []
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    result = {"command": " ".join(sys.argv), "rows": [asdict(r) for r in rows], "cold_equal": same}
    (args.out / "replay.json").write_text(json.dumps(result, indent=1))
    print(summary(rows, same))
    (args.out / "summary.md").write_text(summary(rows, same))


def summary(rows: list[Row], same: list[bool]) -> str:
    out = ["| server | workload | requests | TTFT 1st | total 1st | TTFT later (mean) | total later (mean) | "
           "read later (mean) | accept later |", "|---|---|---|---|---|---|---|---|---|"]
    for server in dict.fromkeys(r.server for r in rows):
        for workload in dict.fromkeys(r.workload for r in rows):
            mine = [r for r in rows if r.server == server and r.workload == workload]
            if not mine:
                continue
            later = mine[1:] or mine

            def mean(xs):
                return sum(xs) / len(xs)
            out.append(f"| {server} | {workload} | {len(mine)} | {mine[0].ttft_s:.2f} | {mine[0].total_s:.2f} | "
                       f"{mean([r.ttft_s for r in later]):.2f} | {mean([r.total_s for r in later]):.2f} | "
                       f"{mean([r.read_tokens for r in later]):.0f} | {mean([r.accept for r in later]):.2f} |")
    if same:
        out.append(f"\ncache-off completions equal: {sum(same)}/{len(same)}")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
