#include "fs/metrics.h"

#include <fmt/core.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <initializer_list>

#include "src/store/log_text.h"

namespace dsfs::fs {

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  size_t i = 0;
  while (i < value.size()) {
    const auto byte = static_cast<unsigned char>(value[i]);
    const size_t length = byte < 0x80 ? 1 : store::utf8_sequence_length(value.substr(i));
    if (length == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    if (length == 1) {
      switch (value[i]) {
        case '\\':
          out += "\\\\";
          break;
        case '"':
          out += "\\\"";
          break;
        case '\n':
          out += "\\n";
          break;
        default:
          out += value[i];
      }
    } else {
      out.append(value.substr(i, length));
    }
    i += length;
  }
  return out;
}

const std::vector<uint64_t>& stall_bucket_bounds_us() {
  static const std::vector<uint64_t> bounds = [] {
    std::vector<uint64_t> b = {1};
    for (int power = 1; power < 26; ++power) {
      b.push_back(uint64_t{1} << power);
      b.push_back(uint64_t{3} << (power - 1));  // 1.5 * 2^power
    }
    b.push_back(uint64_t{1} << 26);
    return b;
  }();
  return bounds;
}

namespace {

struct Label {
  std::string_view name;
  std::string_view value;
};

std::string format_value(uint64_t value) {
  return fmt::format("{}", value);
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);  // the shortest form that reads back the same
}

// Writes families and their samples in the text format onto a string.
class Exposition {
 public:
  explicit Exposition(std::string& out) : out_(out) {}

  // A family's # HELP (backslash and newline escaped) and # TYPE lines.
  void family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} ", name);
    for (const char c : help) {
      if (c == '\\') {
        out_ += "\\\\";
      } else if (c == '\n') {
        out_ += "\\n";
      } else {
        out_ += c;
      }
    }
    out_ += fmt::format("\n# TYPE {} {}\n", name, type);
  }

  template <typename Value>
  void sample(std::string_view name, Value value, std::initializer_list<Label> labels = {}) {
    out_ += name;
    if (labels.size() != 0) {
      out_ += '{';
      bool first = true;
      for (const Label& label : labels) {
        if (!first) out_ += ',';
        first = false;
        out_ += fmt::format("{}=\"{}\"", label.name, escape_label_value(label.value));
      }
      out_ += '}';
    }
    out_ += ' ';
    out_ += format_value(value);
    out_ += '\n';
  }

  // A family of one unlabelled sample.
  template <typename Value>
  void counter(std::string_view name, std::string_view help, Value value) {
    family(name, "counter", help);
    sample(name, value);
  }
  template <typename Value>
  void gauge(std::string_view name, std::string_view help, Value value) {
    family(name, "gauge", help);
    sample(name, value);
  }

 private:
  std::string& out_;
};

uint64_t load(const std::atomic<uint64_t>& counter) {
  return counter.load(std::memory_order_relaxed);
}

void append_requests(Exposition& x, const FsCounters& fs) {
  x.family("dsfs_fuse_requests_total", "counter", "FUSE requests answered, by operation");
  for (size_t i = 0; i < static_cast<size_t>(Op::kCount); ++i) {
    x.sample("dsfs_fuse_requests_total", load(fs.requests[i]),
             {{"op", op_name(static_cast<Op>(i))}});
  }
  x.family("dsfs_fuse_errors_total", "counter",
           "FUSE requests answered with an error, by cause (not_found: ENOENT; read_only: EROFS; "
           "the others: EIO)");
  for (size_t i = 0; i < static_cast<size_t>(ErrorKind::kCount); ++i) {
    x.sample("dsfs_fuse_errors_total", load(fs.errors[i]),
             {{"kind", error_kind_name(static_cast<ErrorKind>(i))}});
  }
  x.counter("dsfs_files_read_total",
            "Dataset files read from offset 0 by the kernel (page-cache misses)",
            load(fs.files_read));
  x.counter("dsfs_read_bytes_total", "Bytes of dataset files returned to readers",
            load(fs.bytes_read));
}

void append_redis(Exposition& x, const prefetch::FetcherStats& f, uint64_t connects) {
  x.counter("dsfs_redis_round_trips_total", "Pipelined round trips to Redis for objects",
            load(f.round_trips));
  x.counter("dsfs_redis_gets_total", "Object GETs sent to Redis", load(f.gets));
  x.counter("dsfs_redis_received_bytes_total", "Object bytes received from Redis", load(f.bytes));
  x.counter("dsfs_redis_retries_total", "Object fetches retried after a Redis failure",
            load(f.retries));
  x.counter("dsfs_redis_connects_total", "Connections made to Redis", connects);
  x.family("dsfs_redis_errors_total", "counter",
           "Object fetches that failed: unavailable (Redis unreachable for the whole timeout) or "
           "reply (Redis answered with an error)");
  x.sample("dsfs_redis_errors_total", load(f.unavailable), {{"kind", "unavailable"}});
  x.sample("dsfs_redis_errors_total", load(f.reply_errors), {{"kind", "reply"}});
  x.family("dsfs_object_errors_total", "counter",
           "Objects that failed their checks: missing key, wrong length, checksum mismatch");
  x.sample("dsfs_object_errors_total", load(f.missing), {{"kind", "missing"}});
  x.sample("dsfs_object_errors_total", load(f.length_mismatches), {{"kind", "length_mismatch"}});
  x.sample("dsfs_object_errors_total", load(f.checksum_mismatches),
           {{"kind", "checksum_mismatch"}});
}

// `prefix`: dsfs_cache or dsfs_view_cache; `what`: the words for its objects.
void append_cache(Exposition& x, std::string_view prefix, std::string_view what,
                  const prefetch::CacheStats& c) {
  const auto name = [prefix](std::string_view suffix) {
    return fmt::format("{}_{}", prefix, suffix);
  };
  x.gauge(name("bytes"), fmt::format("Bytes of {} held in memory now", what), c.bytes);
  x.gauge(name("capacity_bytes"), fmt::format("Bytes of {} the cache may hold", what),
          c.capacity_bytes);
  x.gauge(name("reserved_bytes"), "Room held for loads in flight", c.reserved_bytes);
  x.gauge(name("entries"), fmt::format("Entries ({}) held now", what), c.entries);
  x.counter(name("hits_total"), "Lookups found in the cache", c.hits);
  x.counter(name("misses_total"), "Lookups loaded by the caller", c.misses);
  x.counter(name("joined_total"), "Lookups that waited for a load already in flight", c.joined);
  x.counter(name("evictions_total"), "Entries evicted to make room", c.evictions);
}

void append_prefetch(Exposition& x, const prefetch::ReadStats& reads,
                     const prefetch::EngineStats& e, const prefetch::CacheStats& c) {
  x.family("dsfs_prefetch_reads_total", "counter",
           "READs of dataset files by how they found their bytes: ready (cached), joined (waited "
           "for a fetch in flight), miss (fetched by the reader itself)");
  x.sample("dsfs_prefetch_reads_total", load(reads.ready), {{"outcome", "ready"}});
  x.sample("dsfs_prefetch_reads_total", load(reads.joined), {{"outcome", "joined"}});
  x.sample("dsfs_prefetch_reads_total", load(reads.miss), {{"outcome", "miss"}});
  x.counter("dsfs_prefetch_fetched_bytes_total", "Bytes prefetches brought into the cache",
            c.prefetched_bytes);
  x.counter("dsfs_prefetch_used_bytes_total",
            "Prefetched bytes a reader asked for before they were evicted", c.used_bytes);
  x.counter("dsfs_prefetch_wasted_bytes_total",
            "Prefetched bytes evicted before any reader asked for them", c.wasted_bytes);
  x.counter("dsfs_prefetch_gets_total", "Objects prefetched", e.gets);
  x.counter("dsfs_prefetch_disk_reads_total", "Prefetches staged from the disk tier, not Redis",
            e.disk_reads);
  x.counter("dsfs_prefetch_failures_total", "Prefetches given up (Redis errors, bad data)",
            e.failures);
  x.gauge("dsfs_prefetch_inflight_objects", "Prefetch GETs in flight now", e.inflight_objects);
  x.gauge("dsfs_prefetch_disk_staging_objects",
          "Prefetches queued for the disk tier's readers or being read now", e.staging);
  x.gauge("dsfs_prefetch_disk_staging_passed_on_files",
          "Files a plan's walk passed on while the disk tier's readers were busy, to stage when "
          "their queue frees up",
          e.passed_for_stagers);
  x.gauge("dsfs_prefetch_inflight_bytes", "Bytes of prefetch GETs in flight now", e.inflight_bytes);
  x.gauge("dsfs_prefetch_rtt_seconds", "Measured Redis round-trip time", e.rtt_ms / 1000.0);
  x.gauge("dsfs_prefetch_epoch", "The epoch the prefetch engine believes readers are in", e.epoch);
}

void append_disk_tier(Exposition& x, const prefetch::DiskTierStats& t) {
  x.gauge("dsfs_disk_cache_bytes", "Bytes the disk tier's object files take now (4 KiB blocks)",
          t.bytes_used);
  x.gauge("dsfs_disk_cache_capacity_bytes", "Bytes the disk tier may take (--disk-cache-size)",
          t.capacity_bytes);
  x.gauge("dsfs_disk_cache_entries", "Objects the disk tier holds now", t.entries);
  x.gauge("dsfs_disk_cache_queued_bytes", "Bytes queued to be written to the disk tier",
          t.queued_bytes);
  x.counter("dsfs_disk_cache_hits_total", "Objects read from the disk tier", t.hits);
  x.counter("dsfs_disk_cache_misses_total", "Lookups the disk tier did not hold", t.misses);
  x.counter("dsfs_disk_cache_read_bytes_total", "Object bytes read from the disk tier",
            t.bytes_read);
  x.counter("dsfs_disk_cache_writes_total", "Objects written to the disk tier", t.writes);
  x.counter("dsfs_disk_cache_written_bytes_total", "Object bytes written to the disk tier",
            t.bytes_written);
  x.counter("dsfs_disk_cache_writes_deferred_total",
            "Objects that found the write-behind queue full, written later if still in memory",
            t.writes_deferred);
  x.counter("dsfs_disk_cache_writes_dropped_total",
            "Objects not written: the queue was full and they left memory before a writer was free",
            t.writes_dropped);
  x.counter("dsfs_disk_cache_writes_declined_total",
            "Objects not written: the tier was full of files read in this epoch or the last",
            t.writes_declined);
  x.counter("dsfs_disk_cache_write_errors_total", "Writes that failed (ENOSPC, EIO...)",
            t.write_errors);
  x.counter("dsfs_disk_cache_checksum_failures_total",
            "Object files whose header, length or payload did not check out", t.checksum_failures);
  x.counter("dsfs_disk_cache_stale_drops_total",
            "Object files of the name and generation written for another ingest (or by a dsfs "
            "that did not record it), dropped and read from Redis",
            t.stale_drops);
  x.counter("dsfs_disk_cache_read_errors_total", "Object files that vanished or could not be read",
            t.read_errors);
  x.counter("dsfs_disk_cache_evictions_total", "Objects evicted from the disk tier", t.evictions);
  x.counter(
      "dsfs_disk_cache_page_cache_reads_total",
      "Disk tier hits read through the page cache (it held the file, or direct reads are off)",
      t.page_cache_reads);
  x.counter("dsfs_disk_cache_direct_reads_total",
            "Disk tier hits read from the disk with O_DIRECT, around the page cache",
            t.direct_reads);
}

void append_views(Exposition& x, const ViewStats& v) {
  append_cache(x, "dsfs_view_cache", "rendered .views files", v.cache);
  x.counter("dsfs_view_rendered_total", "MOUNT/.views files rendered", v.rendered);
  x.counter("dsfs_view_render_errors_total", "Images that could not be decoded (each once)",
            v.render_errors);
  x.counter("dsfs_view_read_bytes_total", "Bytes of .views files returned to readers",
            v.bytes_read);
}

// Figures the mount keeps per dataset: what its catalogue holds, for those listed now.
void append_datasets(Exposition& x, const std::vector<const prefetch::DatasetSnapshot*>& datasets) {
  const auto per_dataset = [&](std::string_view name, std::string_view help, auto value) {
    x.family(name, "gauge", help);
    for (const prefetch::DatasetSnapshot* d : datasets) {
      x.sample(name, static_cast<uint64_t>(value(*d)), {{"dataset", d->name()}});
    }
  };
  per_dataset("dsfs_dataset_generation", "The generation of each dataset the mount serves",
              [](const prefetch::DatasetSnapshot& d) { return d.generation(); });
  per_dataset("dsfs_dataset_files", "Files in each dataset the mount serves",
              [](const prefetch::DatasetSnapshot& d) { return d.catalog->file_count(); });
  per_dataset("dsfs_dataset_bytes", "Bytes of the files in each dataset the mount serves",
              [](const prefetch::DatasetSnapshot& d) { return d.catalog->total_bytes(); });
  per_dataset("dsfs_dataset_catalog_memory_bytes", "Memory each dataset's catalogue takes",
              [](const prefetch::DatasetSnapshot& d) { return d.catalog->memory_bytes(); });
}

}  // namespace

void append_stall_histogram(std::string& out, std::string_view name, std::string_view help,
                            const prefetch::StallHistogram& stall) {
  // One read of every bucket, so the buckets and _count agree with each other.
  std::array<uint64_t, prefetch::StallHistogram::kBuckets> counts{};
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = stall.bucket_count(i);
  Exposition x(out);
  x.family(name, "histogram", help);
  const std::string bucket = fmt::format("{}_bucket", name);
  uint64_t cumulative = 0;
  size_t next = 0;  // the first bucket not yet added to `cumulative`
  for (const uint64_t bound_us : stall_bucket_bounds_us()) {
    // Every observation below bound_us lies in a bucket before bound_us's own.
    const size_t end = prefetch::StallHistogram::bucket_of(bound_us);
    for (; next < end; ++next) cumulative += counts[next];
    const std::string le = format_value(static_cast<double>(bound_us) / 1e6);
    x.sample(bucket, cumulative, {{"le", le}});
  }
  for (; next < counts.size(); ++next) cumulative += counts[next];
  x.sample(bucket, cumulative, {{"le", "+Inf"}});
  x.sample(fmt::format("{}_sum", name), stall.total_s());
  x.sample(fmt::format("{}_count", name), cumulative);
}

std::string render_metrics(const StatsSources& sources) {
  std::string out;
  out.reserve(16 << 10);
  Exposition x(out);
  x.family("dsfs_info", "gauge", "The mount's namespace and Redis endpoint (redacted); always 1");
  x.sample("dsfs_info", uint64_t{1},
           {{"namespace", sources.ns}, {"redis", sources.redis_endpoint}});
  x.gauge(
      "dsfs_uptime_seconds", "Seconds since the mount started",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sources.started).count());
  append_requests(x, sources.fs);
  append_redis(x, sources.fetcher, sources.redis_connects);
  append_cache(x, "dsfs_cache", "dataset objects", sources.cache);
  x.gauge("dsfs_memory_resident_bytes", "The mount daemon's resident memory (RSS)",
          sources.resident_bytes);
  x.counter("dsfs_memory_trims_total", "Times freed memory was given back after reads paused",
            sources.memory.trims);
  x.counter("dsfs_memory_released_bytes_total", "Resident memory those trims gave back",
            sources.memory.released_bytes);
  x.gauge("dsfs_memory_reusable_bytes",
          "Freed object buffers kept for the next objects of their size",
          sources.buffer_reuse.held_bytes);
  x.counter("dsfs_memory_buffers_reused_total",
            "Object buffers given out again instead of allocated", sources.buffer_reuse.reused);
  append_prefetch(x, sources.reads, sources.prefetch, sources.cache);
  append_stall_histogram(out, "dsfs_read_stall_seconds",
                         "How long READs of dataset files waited for their bytes (0 when cached)",
                         sources.reads.stall);
  if (sources.disk_tier) append_disk_tier(x, *sources.disk_tier);
  append_views(x, sources.views);
  append_datasets(x, sources.datasets);
  x.counter("dsfs_watch_passes_total",
            "Passes over Redis for datasets published, removed or "
            "re-ingested since the mount",
            sources.watch.polls);
  x.counter("dsfs_watch_failures_total", "Watch passes that could not reach Redis",
            sources.watch.poll_failures);
  return out;
}

}  // namespace dsfs::fs
