"""The `swiftspec` command: flag parsing (engine_args) and the dispatch to generate, serve, bench,
demo, trace, info and models (main)."""
