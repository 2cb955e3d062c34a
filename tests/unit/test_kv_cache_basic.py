"""KVCache basics: slot writes, prefix views and all-layer slot moves (including overlapping ranges)."""

import torch

from swiftspec.cache import KVCache

LAYERS, MAX_LEN, KV_HEADS, HEAD_DIM = 3, 16, 2, 4


def _filled_cache() -> KVCache:
    cache = KVCache(LAYERS, MAX_LEN, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    return cache


def test_shapes_and_zero_init():
    cache = KVCache(LAYERS, MAX_LEN, KV_HEADS, HEAD_DIM, torch.bfloat16, "cpu")
    assert cache.k.shape == cache.v.shape == (LAYERS, MAX_LEN, KV_HEADS, HEAD_DIM)
    assert cache.k.dtype == torch.bfloat16
    assert not cache.k.any() and not cache.v.any()


def test_write_then_view():
    cache = KVCache(LAYERS, MAX_LEN, KV_HEADS, HEAD_DIM, torch.float32, "cpu")
    slots = torch.tensor([4, 0, 7])
    k, v = torch.randn(3, KV_HEADS, HEAD_DIM), torch.randn(3, KV_HEADS, HEAD_DIM)
    cache.write(1, slots, k, v)
    kv = cache.view(1, 8)
    assert kv.k.shape == (8, KV_HEADS, HEAD_DIM)
    torch.testing.assert_close(kv.k[slots], k)
    torch.testing.assert_close(kv.v[slots], v)
    untouched = torch.tensor([1, 2, 3, 5, 6])
    assert not kv.k[untouched].any()
    assert not cache.k[0].any() and not cache.k[2].any(), "other layers untouched"
    kv.k[0].fill_(9.0)  # a view, not a copy
    assert cache.k[1, 0].eq(9.0).all()


def _check_move(src: list[int], dst: list[int]) -> None:
    cache = _filled_cache()
    before_k, before_v = cache.k.clone(), cache.v.clone()
    cache.move(torch.tensor(src), torch.tensor(dst))
    expect_k, expect_v = before_k.clone(), before_v.clone()
    for s, d in zip(src, dst):
        expect_k[:, d], expect_v[:, d] = before_k[:, s], before_v[:, s]
    torch.testing.assert_close(cache.k, expect_k, rtol=0, atol=0)
    torch.testing.assert_close(cache.v, expect_v, rtol=0, atol=0)


def test_move_disjoint():
    _check_move([10, 12, 15], [3, 4, 5])


def test_move_overlapping_down():
    _check_move([5, 6, 7, 8], [3, 4, 5, 6])  # compaction toward the prefix


def test_move_overlapping_up():
    _check_move([3, 4, 5, 6], [5, 6, 7, 8])


def test_move_permutation():
    _check_move([2, 3, 4], [4, 2, 3])  # a cycle: every destination is also a source
