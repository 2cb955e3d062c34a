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
// Below kSerialWork, waking the thread pool costs more than it saves.
template <typename Fn>
void parallel_chunks(int64_t n, int64_t work, const Fn& fn) {
  const int64_t nthreads = std::max<int64_t>(1, at::get_num_threads());
  if (nthreads == 1 || work < kSerialWork) {
    fn(0, n);
    return;
  }
  const int64_t chunk = std::max<int64_t>(1, n / (nthreads * 8));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, nthreads, 1, [&](int64_t, int64_t) {
    for (int64_t u0 = next.fetch_add(chunk); u0 < n; u0 = next.fetch_add(chunk)) fn(u0, std::min(n, u0 + chunk));
  });
}

// Rows [0, rows) of a row-wise op, in parallel only when there is enough work.
template <typename Fn>
void parallel_rows(int64_t rows, int64_t cols, const Fn& fn) {
  const int64_t grain = std::max<int64_t>(1, kSerialWork / std::max<int64_t>(1, cols));
  at::parallel_for(0, rows, grain, fn);  // runs inline below one grain (decode-sized calls)
}

}  // namespace swiftspec
