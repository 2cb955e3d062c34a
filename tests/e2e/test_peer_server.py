"""The llama-server peer runner against a stand-in server: the flags it starts the binary with, and
token ids from a server that returns only text (ik_llama.cpp's /completion has no "tokens")."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

from swiftspec.bench.peers_llamacpp import IK_FLAGS, LlamaServerRunner

STAND_IN = '''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
open(ARGS_FILE, "w").write(json.dumps(argv))
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self): self._send({"status": "ok"})
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body = {"content": "a b c", "timings": {"prompt_ms": 100.0, "predicted_ms": 300.0}}
        if WITH_TOKENS: body["tokens"] = [5, 6, 7, 2]
        self._send(body)
HTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), H).serve_forever()
'''


def _stand_in(tmp_path: Path, with_tokens: bool) -> tuple[Path, Path]:
    args = tmp_path / "argv.json"
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\nARGS_FILE = {str(args)!r}\nWITH_TOKENS = {with_tokens}\n{STAND_IN}")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    return binary, args


def test_text_only_server_is_encoded_and_flags_pass(tmp_path) -> None:
    binary, argv = _stand_in(tmp_path, with_tokens=False)
    encoded = []

    def encode(text: str) -> list[int]:
        encoded.append(text)
        return [11, 12, 2, 13]  # 2 is EOS: clipped

    runner = LlamaServerRunner(str(binary), tmp_path / "t.gguf", 2, 512, frozenset({2}), (0.0, 1.0),
                               tmp_path / "log", extra=IK_FLAGS, encode=encode)
    try:
        result = runner.generate([1, 2, 3], 8, seed=0)
    finally:
        runner.close()
    assert encoded == ["a b c"] and result.tokens == [11, 12]
    assert result.ttft_s == 0.1 and abs(result.total_s - 0.4) < 1e-9
    flags = json.loads(argv.read_text())
    assert all(f in flags for f in IK_FLAGS) and flags[flags.index("-c") + 1] == "512"


def test_server_token_ids_win_over_text(tmp_path) -> None:
    binary, _ = _stand_in(tmp_path, with_tokens=True)
    runner = LlamaServerRunner(str(binary), tmp_path / "t.gguf", 1, 256, frozenset({2}), (0.0, 1.0),
                               tmp_path / "log", encode=lambda text: [99])
    try:
        assert runner.generate([1], 8, seed=0).tokens == [5, 6, 7]
    finally:
        runner.close()
