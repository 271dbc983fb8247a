// Ingest's archive entry handling (libarchive, the decompressors, member names, hard links,
// sparse members) over any bytes, read from a memfd as `dsfs ingest` reads a file. Contents or
// an error, never a crash; what it returns is consistent (sizes match what was streamed).
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

#include <spdlog/spdlog.h>

#include "tools/ingest_object.h"
#include "tools/sources.h"

namespace {

// Counts the bytes of each object; keeps none of them. Asks the source to stop after 16 MiB:
// a few KiB of deflate, or a sparse member's declared hole, expand to gigabytes, and hashing
// them is all an input spent its seconds on (30 executions a second); what matters here is the
// parsing, and that a stop is honoured wherever the bytes come from (a hole ignored it).
class CountingSink final : public dsfs::tools::SourceSink {
 public:
  static constexpr uint64_t kStopAfterBytes = 16 << 20;
  void put_piece(const dsfs::tools::PieceKey& key, std::string bytes, bool) override {
    sizes[key.object_id] += bytes.size();
    total += bytes.size();
    // The source checks for a stop at least once per block it streams (blocks are far smaller).
    if (total > kStopAfterBytes + (256 << 20)) __builtin_trap();
  }
  bool stop_requested() const override { return total >= kStopAfterBytes; }
  std::map<uint64_t, uint64_t> sizes;
  uint64_t total = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (spdlog::set_level(spdlog::level::off), true);
  (void)quiet;
  const int fd = ::memfd_create("dsfs-archive-fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  for (size_t written = 0; written < size;) {
    const ssize_t n = ::write(fd, data + written, size - written);
    if (n <= 0) break;
    written += static_cast<size_t>(n);
  }
  try {
    dsfs::tools::SourceOptions options;
    options.chunk_size = 1 << 16;
    CountingSink sink;
    const auto contents =
        dsfs::tools::make_archive_source("/proc/self/fd/" + std::to_string(fd), options)
            ->read(sink);
    for (const auto& file : contents.files) {
      const auto it = sink.sizes.find(file.object_id);
      const uint64_t streamed = it == sink.sizes.end() ? 0 : it->second;
      if (streamed != file.size) __builtin_trap();
    }
  } catch (const std::exception&) {  // a damaged or unreadable archive: an error, as it should
  }
  ::close(fd);
  return 0;
}
