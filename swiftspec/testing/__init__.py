"""Tiny random checkpoints (HF and GGUF) and random quantized blocks: what the tests build, and
the CUDA start-up check (engines/device.py) runs."""
