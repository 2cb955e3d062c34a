"""The engines, the server and the CLI import where the gguf package is missing (a GPU machine's
own image, benchmarks/gpu_check.py): only reading or writing a GGUF file needs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK = """
import importlib, importlib.abc, sys
class NoGguf(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "gguf":
            raise ImportError("no gguf here")
sys.meta_path.insert(0, NoGguf())
for m in sys.argv[1:]:
    importlib.import_module(m)
"""


def test_engines_server_and_cli_import_without_gguf() -> None:
    modules = ["swiftspec.engines", "swiftspec.engines.device", "swiftspec.engines.defaults",
               "swiftspec.distributed.workers", "swiftspec.serve.server", "swiftspec.cli.main"]
    done = subprocess.run([sys.executable, "-c", BLOCK, *modules], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    failing = subprocess.run([sys.executable, "-c", BLOCK, "swiftspec.weights.gguf"], cwd=ROOT,
                             capture_output=True, text=True)
    assert "no gguf here" in failing.stderr  # the block works: a GGUF reader does need it
