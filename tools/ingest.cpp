#include "tools/ingest.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <ctime>
#include <memory>
#include <optional>

#include "src/catalog/dataset.h"
#include "src/catalog/names.h"
#include "src/store/connection.h"
#include "src/store/pool.h"
#include "tools/ingest_writer.h"
#include "tools/sources.h"

namespace dsfs::tools {
namespace {

constexpr unsigned kMaxJobs = 64;
constexpr std::chrono::milliseconds kPublishRetryBudget{15000};

// Best effort after a failure: deletes what this ingest wrote of its own generation, unless the
// publish got as far as making it current. Never throws; what it cannot delete the next
// successful ingest's garbage collection removes (the generation stays in the gens set).
// Returns the dataset's current generation as read now (0: none), or nullopt if unreadable.
std::optional<uint64_t> discard_generation(const store::RedisEndpoint& endpoint,
                                           const catalog::KeySchema& keys, const std::string& name,
                                           uint64_t generation) {
  std::optional<uint64_t> current;
  try {
    store::Connection conn(endpoint);
    try {
      current = catalog::read_info(conn, keys, name).generation;
    } catch (const catalog::DatasetNotFound&) {
      current = 0;
    }
    if (*current == generation) {
      spdlog::warn("generation {} of '{}' was published before the failure; keeping it", generation,
                   name);
      return current;
    }
    const uint64_t deleted = catalog::delete_generation(conn, keys, name, generation);
    spdlog::info("removed {} keys of the unpublished generation {} of '{}'", deleted, generation,
                 name);
  } catch (const std::exception& e) {
    spdlog::warn(
        "could not remove the unpublished generation {} of '{}' ({}); the next successful "
        "ingest of '{}' removes it",
        generation, name, e.what(), name);
  }
  return current;
}

// What a failed ingest left current: `current` as discard_generation read it (a concurrent
// ingest or rm may have changed it since the start), else what was current at the start.
std::string outcome(uint64_t generation, const std::optional<uint64_t>& previous_generation,
                    const std::optional<uint64_t>& current) {
  const uint64_t now = current ? *current : previous_generation.value_or(0);
  if (now != 0 && now == generation) {
    return fmt::format("generation {} was published nonetheless", generation);
  }
  if (now == 0) return "nothing was published (the dataset does not exist)";
  return fmt::format("nothing was published (generation {} is {}current)", now,
                     previous_generation == now ? "still " : "");
}

// Redis's run_id, new on every start of the server; "" when INFO is not allowed.
std::string server_run_id(store::Connection& conn) {
  const store::Reply reply = conn.command({"INFO", "server"});
  if (!reply.is_string()) return {};
  const std::string_view text = reply.str();
  constexpr std::string_view kField = "run_id:";
  const size_t at = text.find(kField);
  if (at == std::string_view::npos) return {};
  const size_t begin = at + kField.size();
  const size_t end = text.find_first_of("\r\n", begin);
  return std::string(text.substr(begin, end == std::string_view::npos ? end : end - begin));
}

// How many of the objects `catalog` needs are missing from generation `gen` (EXISTS, pipelined
// in batches so the key list never grows with the dataset).
uint64_t count_missing_objects(store::Connection& conn, const catalog::KeySchema& keys,
                               const std::string& name, uint64_t gen,
                               const catalog::Catalog& catalog) {
  constexpr size_t kBatch = 4096;
  constexpr size_t kWindow = 256;
  uint64_t missing = 0;
  std::vector<std::array<std::string, 2>> batch;
  auto flush = [&] {
    store::pipeline(conn, batch, kWindow, [&](size_t, store::Reply& reply) {
      if (reply.expect_ok("EXISTS").integer() == 0) ++missing;
    });
    batch.clear();
  };
  for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
    const catalog::CatalogEntry& entry = catalog.entry(i);
    if (entry.is_dir) continue;
    const uint64_t chunks = catalog.chunk_count(i);
    for (uint64_t k = 0; k < chunks; ++k) {
      batch.push_back({"EXISTS", keys.object_piece(name, gen, entry.object_id, k, chunks > 1)});
      if (batch.size() == kBatch) flush();
    }
  }
  if (!batch.empty()) flush();
  return missing;
}

}  // namespace

void validate_ingest_options(const IngestOptions& options) {
  catalog::validate_new_dataset_name(options.dataset);
  if (options.jobs < 1 || options.jobs > kMaxJobs) {
    throw std::invalid_argument(
        fmt::format("--jobs {} is out of range: use 1 to {}", options.jobs, kMaxJobs));
  }
  if (options.chunk_size < 1 || options.chunk_size > kMaxChunkSize) {
    throw std::invalid_argument(
        fmt::format("--chunk-size {} is out of range: use 1 byte to 512 MiB", options.chunk_size));
  }
  if (options.checksum != catalog::ChecksumKind::kXxh64 &&
      options.checksum != catalog::ChecksumKind::kNone) {
    throw std::invalid_argument("--checksum must be xxh64 or none");
  }
  if (options.max_bytes_in_flight == 0) {
    throw std::invalid_argument("the in-flight memory bound must be at least 1 byte");
  }
}

IngestResult run_ingest(const store::RedisEndpoint& endpoint, const catalog::KeySchema& keys,
                        const IngestOptions& options) {
  validate_ingest_options(options);
  const auto start = std::chrono::steady_clock::now();
  const std::string& name = options.dataset;
  auto stop_requested = [&] { return options.stop && options.stop->load(); };

  std::optional<SampleMetadata> metadata;
  if (options.metadata_file) metadata = load_metadata_file(*options.metadata_file);
  SourceOptions source_options;
  source_options.parallelism = options.jobs;
  source_options.chunk_size = options.chunk_size;
  source_options.checksum = options.checksum;
  source_options.symlinks = options.symlinks;
  source_options.url_stall_timeout = options.url_stall_timeout;
  source_options.url_min_bytes_per_second = options.url_min_bytes_per_second;
  source_options.url_file_deadline = options.url_file_deadline;
  const auto source = open_source(options.source, source_options);

  // The control connection idles while objects are written; if Redis dropped it meanwhile (a
  // restart, a timeout), publish and collection reconnect instead of failing the ingest.
  std::optional<store::Connection> control_connection;
  auto control = [&]() -> store::Connection& {
    if (!control_connection || control_connection->broken()) control_connection.emplace(endpoint);
    return *control_connection;
  };
  std::optional<uint64_t> previous_generation;
  try {
    previous_generation = catalog::read_info(control(), keys, name).generation;
  } catch (const catalog::DatasetNotFound&) {
  }
  // The server that acknowledges our writes; if another one answers at publish time (a restart),
  // acknowledged writes may have been lost with the old one.
  std::string verified_run_id = server_run_id(control());
  const uint64_t generation = catalog::begin_generation(control(), keys, name);
  spdlog::debug("ingesting {} '{}' into '{}' generation {}", to_string(source->kind()),
                source->description(), name, generation);

  IngestResult result;
  result.generation = generation;
  Progress progress(fmt::format("ingest {}", name), ProgressOptions{.style = options.progress});
  try {
    catalog::DatasetInfo info;
    SourceContents contents;
    {
      WriterOptions writer_options;
      writer_options.connections = options.jobs;
      writer_options.max_bytes_in_flight = options.max_bytes_in_flight;
      writer_options.on_piece_written = options.on_piece_written;
      RedisPieceWriter writer(endpoint, keys, name, generation, std::move(writer_options),
                              options.stop, &progress);
      try {
        contents = source->read(writer);
        writer.finish();
      } catch (const StopRequested&) {
        // A source thread saw the stop; the reason is a write error or the external stop.
        if (const auto error = writer.error()) std::rethrow_exception(error);
        throw IngestInterrupted("interrupted");
      }
    }
    if (stop_requested()) throw IngestInterrupted("interrupted");

    CatalogBuildStats stats;
    const catalog::Catalog catalog =
        build_catalog(contents, options.labels, metadata ? &*metadata : nullptr, options.checksum,
                      options.chunk_size, &stats);
    if (stats.metadata_unknown_paths > 0) {
      spdlog::warn("{} of {} metadata lines name no file of '{}' and were ignored",
                   stats.metadata_unknown_paths, metadata->by_path.size(), name);
    }
    if (stop_requested()) throw IngestInterrupted("interrupted");

    info.name = name;
    info.generation = generation;
    info.file_count = catalog.file_count();
    info.dir_count = catalog.directory_count();
    info.total_bytes = catalog.total_bytes();
    info.class_count = catalog.classes().size();
    info.created_unix = static_cast<int64_t>(std::time(nullptr));
    info.source = source->description();
    info.chunk_size = options.chunk_size;
    // Publishing again after a broken connection is safe: the manifest SETs are idempotent and
    // the flip of the same generation is a no-op.
    store::with_retry(kPublishRetryBudget, [&] {
      store::Connection& conn = control();
      // A restarted Redis keeps only what it had persisted (appendfsync everysec: all but the
      // last second or so), so check every object before making the generation current. The
      // flip runs on this same connection, hence on the server just checked.
      const std::string run_id = server_run_id(conn);
      if (run_id.empty() || run_id != verified_run_id) {
        const uint64_t missing = count_missing_objects(conn, keys, name, generation, catalog);
        if (missing > 0) {
          throw std::runtime_error(fmt::format(
              "Redis at {} restarted during the ingest and lost {} object key(s) it had "
              "acknowledged (writes not yet persisted when it stopped); ingest again",
              endpoint.describe(), missing));
        }
        verified_run_id = run_id;
      }
      catalog::publish(conn, keys, info, catalog);
    });

    result.files = info.file_count;
    result.directories = info.dir_count;
    result.bytes = info.total_bytes;
    result.classes = info.class_count;
    result.skipped = contents.skipped;
  } catch (const IngestInterrupted&) {
    progress.stop();
    const auto current = discard_generation(endpoint, keys, name, generation);
    throw IngestInterrupted(fmt::format("ingest of '{}' interrupted; {}", name,
                                        outcome(generation, previous_generation, current)));
  } catch (const std::exception& e) {
    progress.stop();
    const auto current = discard_generation(endpoint, keys, name, generation);
    throw std::runtime_error(fmt::format("ingest of '{}' failed: {}; {}", name, e.what(),
                                         outcome(generation, previous_generation, current)));
  }
  progress.stop();

  try {
    result.garbage_keys_deleted = store::with_retry(kPublishRetryBudget, [&] {
      return catalog::collect_garbage(control(), keys, name, options.keep_generations);
    });
  } catch (const std::exception& e) {
    spdlog::warn(
        "published '{}' generation {}, but removing old generations failed ({}); the "
        "next ingest retries",
        name, generation, e.what());
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string format_ingest_summary(const std::string& dataset, const IngestResult& result) {
  const double megabytes = static_cast<double>(result.bytes) / 1e6;
  const double rate = result.seconds > 0 ? megabytes / result.seconds : 0;
  std::string summary = fmt::format(
      "ingested '{}': {} files, {:.1f} MB in {:.2f} s ({:.1f} MB/s), generation {}", dataset,
      format_count(result.files), megabytes, result.seconds, rate, result.generation);
  if (result.classes > 0) {
    summary += fmt::format(", {} {}", format_count(result.classes),
                           result.classes == 1 ? "class" : "classes");
  }
  if (result.skipped > 0) summary += fmt::format(", {} skipped", format_count(result.skipped));
  return summary;
}

}  // namespace dsfs::tools
