#pragma once
// `dsfs ingest` as a library call: read a source, write its objects to a fresh generation, then
// publish that generation atomically; on any failure or interruption publish nothing and remove
// what was written.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "tools/ingest_catalog.h"
#include "tools/progress.h"

namespace dsfs::tools {

struct IngestOptions {
  std::filesystem::path source;
  std::string dataset;
  LabelMode labels = LabelMode::kAuto;
  std::optional<std::filesystem::path> metadata_file;
  // Directory sources: which symlinks are followed (all: as torchvision's ImageFolder does).
  SymlinkPolicy symlinks = SymlinkPolicy::kAll;
  // URL lists: see SourceOptions.
  std::chrono::milliseconds url_stall_timeout{30000};
  uint64_t url_min_bytes_per_second = 1024;
  std::chrono::milliseconds url_file_deadline{30 * 60 * 1000};
  unsigned jobs = 4;  // writer threads (each with a connection per node); also reader threads /
                      // concurrent downloads
  uint64_t chunk_size = catalog::kDefaultChunkSize;
  catalog::ChecksumKind checksum = catalog::ChecksumKind::kXxh64;
  unsigned keep_generations = 1;  // previous generations kept for mounted readers
  uint64_t max_bytes_in_flight = 256ull << 20;
  ProgressStyle progress = ProgressStyle::kAuto;
  // Polled throughout; when it becomes true the ingest stops and publishes nothing (SIGINT).
  const std::atomic<bool>* stop = nullptr;
  // Test hook: called after each piece Redis acknowledged, with the count so far.
  std::function<void(uint64_t pieces_written)> on_piece_written;
};

struct IngestResult {
  uint64_t generation = 0;
  uint64_t files = 0;
  uint64_t directories = 0;
  uint64_t bytes = 0;
  uint64_t classes = 0;
  uint64_t skipped = 0;
  uint64_t garbage_keys_deleted = 0;
  double seconds = 0;
};

// The ingest was stopped by IngestOptions::stop; nothing was published.
class IngestInterrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Largest chunk Redis accepts as one string value (proto-max-bulk-len default is 512 MB).
inline constexpr uint64_t kMaxChunkSize = 512ull << 20;

// Checks the options that need no I/O; throws std::invalid_argument naming the bad one.
void validate_ingest_options(const IngestOptions& options);

// Runs the ingest through `client` (a single server or a Redis Cluster). Throws
// IngestInterrupted, or std::runtime_error (and subclasses such as store::ConnectionError) whose
// message says what failed, that nothing was published, and what to do. The previous
// generation, if any, stays current on every failure.
IngestResult run_ingest(store::Client& client, const catalog::KeySchema& keys,
                        const IngestOptions& options);

// "ingested 'x': 1,000 files, 110.2 MB in 3.2 s (34.4 MB/s), generation 3".
std::string format_ingest_summary(const std::string& dataset, const IngestResult& result);

}  // namespace dsfs::tools
