"""`swiftspec bench` and its parts: command.py (flags, the run, report.json's content), harness.py
(modes run interleaved), runners.py (our engines and the peers), report.py (report.md and the
machine), perplexity.py (`swiftspec perplexity`) and check.py (`python -m swiftspec.bench.check`)."""
