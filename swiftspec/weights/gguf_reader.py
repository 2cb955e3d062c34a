"""The GGUF header parse: gguf-py's GGUFReader, made fast for files with a large vocabulary.

GGUFReader parses every metadata element (151,936 vocabulary strings, as many merges and token
types in a Qwen2.5 file) into numpy views of its own, which dominated opening a file and kept
hundreds of thousands of small objects alive.  Here an array is one field of three parts (element
type, count, and all its elements' bytes); its `contents()` splits them when asked, and gives
what GGUFReader's would.  Tensor data stay zero-copy, read-only views of the file's memory map.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, ReaderField

_STRING_LEN = struct.Struct("=Q")  # native order: only files in this host's order are packed


class PackedArray(ReaderField):
    """A metadata array as its element type, count and raw element bytes (parts[-3:])."""

    def contents(self, index_or_slice: int | slice = slice(None)) -> Any:
        itype, count, blob = int(self.parts[-3][0]), int(self.parts[-2][0]), self.parts[-1]
        if itype == GGUFValueType.STRING:
            values = _split_strings(blob.tobytes(), count)
        else:
            values = blob.view(GGUFReader.gguf_scalar_to_np[GGUFValueType(itype)]).tolist()
        return values[index_or_slice]


@dataclass(frozen=True, slots=True)
class _ArrayValue:
    """A flat array's parts (element type, count, element bytes) and the offset after it."""

    parts: list[np.ndarray]
    end: int


class FastReader(GGUFReader):
    """GGUFReader that slices a plain ndarray view of its memmap (each memmap slice pays for the
    subclass's bookkeeping, __array_finalize__) and reads a flat array of strings or scalars as one
    PackedArray instead of a pair of views per element (docs/bench/code-figures.md)."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        if "_plain" not in self.__dict__:
            self._plain = self.data.view(np.ndarray)
        dt, count = np.dtype(dtype), int(count)
        arr = self._plain[offset : offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _build_fields(self, offs: int, count: int) -> int:
        """GGUFReader's walk over the key-value pairs, an array of strings or scalars read as one
        PackedArray (other values, and every value of a swapped-order file, as GGUFReader reads them)."""
        for _ in range(count):
            orig_offs = offs
            key_len, key = self._get_str(offs)
            offs += int(key_len.nbytes + key.nbytes)
            raw_type = self._get(offs, np.uint32)
            offs += int(raw_type.nbytes)
            head, name = [key_len, key, raw_type], str(bytes(key), encoding="utf-8")
            array = self._flat_array(offs) if raw_type[0] == GGUFValueType.ARRAY else None
            if array is not None:
                types = [GGUFValueType.ARRAY, GGUFValueType(int(array.parts[0][0]))]
                self._push_field(PackedArray(orig_offs, name, head + array.parts, [5], types), skip_sum=True)
                offs = array.end
                continue
            size, parts, data, types = self._get_field_parts(offs, raw_type[0])
            self._push_field(ReaderField(orig_offs, name, head + parts, [i + len(head) for i in data], types),
                             skip_sum=True)
            offs += size
        return offs

    def _flat_array(self, offs: int) -> _ArrayValue | None:
        """The array value at offs when it is a flat array of strings or scalars in this host's order."""
        itype, count = self._get(offs, np.uint32), self._get(offs + 4, np.uint64)
        start, n = offs + 12, int(count[0])
        scalar = self.gguf_scalar_to_np.get(GGUFValueType(itype[0]))
        if self.byte_order != "I" or (scalar is None and itype[0] != GGUFValueType.STRING):
            return None
        if scalar is not None:
            end = start + np.dtype(scalar).itemsize * n
        else:
            end = _skip_strings(memoryview(self._plain), start, n)
        if end > len(self._plain):
            raise ValueError("metadata array extends past the end of the file")
        return _ArrayValue([itype, count, self._get(start, np.uint8, end - start)], end)


def _skip_strings(buf: memoryview, offs: int, count: int) -> int:
    """The offset after `count` length-prefixed strings starting at offs."""
    for _ in range(count):
        offs += 8 + _STRING_LEN.unpack_from(buf, offs)[0]
    return offs


def _split_strings(buf: bytes, count: int) -> list[str]:
    out, offs = [], 0
    for _ in range(count):
        n = _STRING_LEN.unpack_from(buf, offs)[0]
        out.append(buf[offs + 8 : offs + 8 + n].decode("utf-8"))
        offs += 8 + n
    return out
