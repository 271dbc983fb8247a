#include "tools/ingest.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <ctime>
#include <map>
#include <memory>
#include <optional>

#include "src/catalog/dataset.h"
#include "src/catalog/names.h"
#include "src/store/client.h"
#include "src/store/errors.h"
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
std::optional<uint64_t> discard_generation(store::Client& client, const catalog::KeySchema& keys,
                                           const std::string& name, uint64_t generation) {
  std::optional<uint64_t> current;
  try {
    try {
      current = catalog::read_info(client, keys, name).generation;
    } catch (const catalog::DatasetNotFound&) {
      current = 0;
    }
    if (*current == generation) {
      spdlog::warn("generation {} of '{}' was published before the failure; keeping it", generation,
                   name);
      return current;
    }
    const uint64_t deleted = catalog::delete_generation(client, keys, name, generation);
    spdlog::info("removed {} keys of the unpublished generation {} of '{}'", deleted, generation,
                 name);
    if (*current == 0) catalog::forget_if_nothing_left(client, keys, name);
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

// Redis's run_id, new on every start of a server, of every primary ("host:port=RUN_ID,..."):
// it changes when a server restarts or a replica takes over from its primary, the two ways
// acknowledged writes get lost (writes not yet persisted, or not yet replicated). "" when INFO is
// not allowed on some node.
std::string primaries_run_ids(store::Client& client) {
  // By node, so a pass that for_each_primary runs again after a failover overwrites, not adds.
  std::map<std::string, std::string> run_ids;
  client.for_each_primary([&](store::Connection& conn) {
    const store::Reply reply = conn.command({"INFO", "server"});
    std::string run_id;
    if (reply.is_string()) {
      const std::string_view text = reply.str();
      constexpr std::string_view kField = "run_id:";
      if (const size_t at = text.find(kField); at != std::string_view::npos) {
        const size_t begin = at + kField.size();
        const size_t end = text.find_first_of("\r\n", begin);
        run_id = text.substr(begin, end == std::string_view::npos ? end : end - begin);
      }
    }
    run_ids[conn.endpoint().describe()] = std::move(run_id);
  });
  std::string joined;
  for (const auto& [node, run_id] : run_ids) {
    if (run_id.empty()) return {};
    joined += fmt::format("{}{}={}", joined.empty() ? "" : ",", node, run_id);
  }
  return joined;
}

// How many of the objects `catalog` needs are missing from generation `gen` (EXISTS, pipelined
// in batches so the key list never grows with the dataset).
uint64_t count_missing_objects(store::Client& client, const catalog::KeySchema& keys,
                               const std::string& name, uint64_t gen,
                               const catalog::Catalog& catalog) {
  constexpr size_t kBatch = 4096;
  constexpr size_t kWindow = 256;
  uint64_t missing = 0;
  std::vector<std::array<std::string, 2>> batch;
  auto flush = [&] {
    client.pipeline(batch, kWindow, [&](size_t, store::Reply& reply) {
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

IngestResult run_ingest(store::Client& client, const catalog::KeySchema& keys,
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

  // The client's pooled connections idle while objects are written; if Redis dropped them
  // meanwhile (a restart, a timeout), publish and collection connect again.
  std::optional<uint64_t> previous_generation;
  try {
    previous_generation = catalog::read_info(client, keys, name).generation;
  } catch (const catalog::DatasetNotFound&) {
  }
  // The servers that acknowledge our writes; if others answer at publish time (a restart, a
  // failover), acknowledged writes may have been lost with the old ones.
  std::string verified_run_ids = primaries_run_ids(client);
  // Objects evicted later fail reads of their files with EIO, in this dataset and every other.
  bool evicting_now = false;
  if (const std::string risk = catalog::eviction_risk(client, &evicting_now); !risk.empty()) {
    if (evicting_now) {
      throw std::runtime_error(fmt::format(
          "{}: files of '{}' and of every other dataset there would be lost when it fills; set "
          "maxmemory-policy noeviction (redis-cli CONFIG SET maxmemory-policy noeviction, and in "
          "its config file), then ingest again",
          risk, name));
    }
    spdlog::warn(
        "{}: once a maxmemory is set, files of every dataset there can be lost; set "
        "maxmemory-policy noeviction",
        risk);
  }
  const uint64_t generation = catalog::begin_generation(client, keys, name);
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
      RedisPieceWriter writer(client, keys, name, generation, std::move(writer_options),
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
    // A restarted Redis keeps only what it had persisted (appendfsync everysec: all but the
    // last second or so), and a replica that takes over may lack the last writes its primary
    // acknowledged: when the primaries are not those that took the writes, check every object
    // before making the generation current (and again after, for a restart in between).
    const auto check_nothing_lost = [&](bool published) {
      const std::string run_ids = primaries_run_ids(client);
      if (!run_ids.empty() && run_ids == verified_run_ids) return;
      if (published && run_ids.empty()) return;  // INFO not allowed: checked just before
      const uint64_t missing = count_missing_objects(client, keys, name, generation, catalog);
      if (missing > 0) {
        throw std::runtime_error(fmt::format(
            "Redis at {} restarted during the ingest and lost {} object key(s) it had "
            "acknowledged (writes not yet persisted when it stopped, or not yet replicated when "
            "a replica took over); ingest again",
            client.describe(), missing));
      }
      verified_run_ids = run_ids;
    };
    // Publishing again after a broken connection is safe: the manifest SETs are idempotent and
    // the flip of the same generation is a no-op. The client retries single commands itself;
    // this loop covers the flip, which runs on one connection that must not change under it.
    store::Backoff publish_backoff(kPublishRetryBudget);
    for (;;) {
      try {
        check_nothing_lost(false);
        // A stop that comes while the manifest is written still publishes nothing (writing a
        // large manifest far from Redis takes seconds).
        catalog::publish(client, keys, info, catalog, [&] {
          if (stop_requested()) throw IngestInterrupted("interrupted");
        });
        break;
      } catch (const store::ConnectionError& e) {
        if (!publish_backoff.wait()) throw;
        spdlog::debug("publish of '{}' failed ({}); trying again", name, e.what());
      }
    }
    try {
      check_nothing_lost(true);
    } catch (const store::ConnectionError& e) {
      spdlog::warn(
          "published '{}' generation {}, but could not check afterwards that Redis kept every "
          "object ({}); `dsfs info {}` and a read of the mount show whether it did",
          name, generation, e.what(), name);
    }

    result.files = info.file_count;
    result.directories = info.dir_count;
    result.bytes = info.total_bytes;
    result.classes = info.class_count;
    result.skipped = contents.skipped;
  } catch (const IngestInterrupted&) {
    progress.stop();
    const auto current = discard_generation(client, keys, name, generation);
    throw IngestInterrupted(fmt::format("ingest of '{}' interrupted; {}", name,
                                        outcome(generation, previous_generation, current)));
  } catch (const std::exception& e) {
    progress.stop();
    const auto current = discard_generation(client, keys, name, generation);
    throw std::runtime_error(fmt::format("ingest of '{}' failed: {}; {}", name, e.what(),
                                         outcome(generation, previous_generation, current)));
  }
  progress.stop();

  try {
    result.garbage_keys_deleted =
        catalog::collect_garbage(client, keys, name, options.keep_generations);
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
