"""Key/value cache storage for the model runtime."""

from swiftspec.cache.kv_cache import KVCache, LayerKV

__all__ = ["KVCache", "LayerKV"]
