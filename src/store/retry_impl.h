#pragma once
#include <algorithm>
#include <thread>

#include "src/store/errors.h"

namespace dsfs::store {

template <typename Fn>
auto with_retry(std::chrono::milliseconds budget, Fn&& fn) -> decltype(fn()) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + budget;
  std::chrono::milliseconds backoff{50};
  for (;;) {
    try {
      return fn();
    } catch (const ConnectionError&) {
      const auto now = Clock::now();
      if (now >= deadline) throw;
      const auto remaining = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now);
      std::this_thread::sleep_for(std::min(backoff, remaining));
      backoff = std::min(backoff * 2, std::chrono::milliseconds{1000});
    }
  }
}

}  // namespace dsfs::store
