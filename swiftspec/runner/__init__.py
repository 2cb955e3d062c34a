"""The execution layer: a loaded model with its KV cache run as one forward (runner), CUDA graphs
replaying its shapes (cuda_graph), and loading a target ready to run (load)."""
