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

// Counts the bytes of each object; keeps none of them.
class CountingSink final : public dsfs::tools::SourceSink {
 public:
  void put_piece(const dsfs::tools::PieceKey& key, std::string bytes, bool) override {
    sizes[key.object_id] += bytes.size();
  }
  bool stop_requested() const override { return false; }
  std::map<uint64_t, uint64_t> sizes;
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
