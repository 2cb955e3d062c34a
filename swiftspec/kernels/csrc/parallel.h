// Thread splits and scratch buffers shared by the glue files.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

namespace swiftspec {

// Below this many (tile x K x row) steps, waking the thread pool costs more than it saves.
constexpr int64_t kSerialWork = 1 << 15;

template <typename T>
T* sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// Runs fn(u0, u1) over units [0, n): threads take chunks from a shared counter, so a thread slowed
// down by a busy core simply takes fewer chunks, and each chunk is one sequential weight stream.
// Chunks shrink as the work runs out (a share of what is left, down to n / 64 per thread), so the
// threads finish close together; fixed chunks of n / 16 left one core waiting for the other's
// last chunk at every call (the target's forward, 2 threads, docs/bench/rows.md: 1 row at 200
// tokens of context 43.7 -> 42.4 ms and 44.0 -> 43.7 in two interleaved A/Bs at avx512-bf16, 8 rows
// 99.3 -> 91.7 at avx2).  Which thread runs a unit never changes its result.  Below kSerialWork,
// waking the thread pool costs more than it saves.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t work, const Fn& fn) {
  const int64_t nthreads = std::max<int64_t>(1, at::get_num_threads());
  if (nthreads == 1 || work < kSerialWork) {
    fn(0, n);
    return;
  }
  const int64_t least = std::max<int64_t>(1, n / (nthreads * 64));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    int64_t u0 = next.load(std::memory_order_relaxed);
    while (u0 < n) {  // a failed exchange reloads u0
      const int64_t chunk = std::max(least, (n - u0) / (nthreads * 2));
      if (next.compare_exchange_weak(u0, u0 + chunk, std::memory_order_relaxed)) {
        fn(u0, std::min(n, u0 + chunk));
        u0 = next.load(std::memory_order_relaxed);
      }
    }
  });
}

// Rows [0, rows) of a row-wise op, in parallel only when there is enough work.
template <typename Fn>
void parallel_rows(int64_t rows, int64_t cols, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, kSerialWork / std::max<int64_t>(1, cols));
  at::parallel_for(0, rows, grain, fn);  // runs inline below one grain (decode-sized calls)
}

}  // namespace swiftspec
