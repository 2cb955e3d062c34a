"""Optional Triton: availability, compile-on-first-use, and the two grid helpers the hosts need.

Triton is imported only when a kernel is first compiled, never when swiftspec is imported. That
keeps the package importable without Triton, and it lets a test set TRITON_INTERPRET=1 (the CPU
interpreter) at any point before its first launch: Triton reads that variable when it is imported
(its own library functions are built then) and when a kernel is built.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Callable


@functools.cache
def available() -> bool:
    """True when Triton can be imported (looked up, not imported)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def jit(fn: Callable, do_not_specialize: tuple[str, ...] = ()) -> Any:
    """triton.jit(fn), built once per kernel. Kernel bodies say `tl.` for triton.language: this binds
    the name `tl` in the kernel's module (where it is declared None) as Triton is imported. Arguments
    named in do_not_specialize (sizes that vary per call) change without a recompile."""
    import triton
    import triton.language as tl

    fn.__globals__["tl"] = tl
    return triton.jit(fn, do_not_specialize=do_not_specialize)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
