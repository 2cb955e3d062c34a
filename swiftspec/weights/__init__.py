"""Model files and loading: source.py (a name -> the local GGUF file or HF directory), loader.py
(-> LoadedModel, defined in loaded_model.py), and the readers and caches they use (safetensors, gguf,
convert, bundled, hub).  Import from those modules; this package re-exports nothing."""
