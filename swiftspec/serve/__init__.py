"""User-facing entry points: the `swiftspec` CLI and the OpenAI-compatible HTTP server."""
