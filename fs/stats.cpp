#include "fs/stats.h"

#include <nlohmann/json.hpp>

namespace dsfs::fs {

std::string_view op_name(Op op) {
  switch (op) {
    case Op::kInit:
      return "init";
    case Op::kLookup:
      return "lookup";
    case Op::kGetattr:
      return "getattr";
    case Op::kOpen:
      return "open";
    case Op::kRead:
      return "read";
    case Op::kForget:
      return "forget";
    case Op::kOpendir:
      return "opendir";
    case Op::kReaddir:
      return "readdir";
    case Op::kReaddirplus:
      return "readdirplus";
    case Op::kReleasedir:
      return "releasedir";
    case Op::kStatfs:
      return "statfs";
    case Op::kGetxattr:
      return "getxattr";
    case Op::kListxattr:
      return "listxattr";
    case Op::kIoctl:
      return "ioctl";
    case Op::kFlush:
      return "flush";
    case Op::kWrite:
      return "write";
    case Op::kCount:
      break;
  }
  return "unknown";
}

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kNotFound:
      return "not_found";
    case ErrorKind::kReadOnly:
      return "read_only";
    case ErrorKind::kIntegrity:
      return "integrity";
    case ErrorKind::kUnavailable:
      return "redis_unavailable";
    case ErrorKind::kRedisError:
      return "redis_error";
    case ErrorKind::kInternal:
      return "internal";
    case ErrorKind::kCount:
      break;
  }
  return "unknown";
}

namespace {

nlohmann::ordered_json cache_json(const prefetch::CacheStats& c) {
  return {{"capacity_bytes", c.capacity_bytes},
          {"bytes", c.bytes},
          {"entries", c.entries},
          {"hits", c.hits},
          {"misses", c.misses},
          {"joined", c.joined},
          {"evictions", c.evictions},
          {"too_large", c.too_large},
          {"not_kept", c.not_kept},
          {"victims_examined", c.victims_examined},
          {"reserved_bytes", c.reserved_bytes}};
}

nlohmann::ordered_json prefetch_json(const prefetch::ReadStats& reads,
                                     const prefetch::EngineStats& e, const prefetch::CacheStats& c,
                                     uint64_t plan_unresolved) {
  const uint64_t ready = reads.ready.load(std::memory_order_relaxed);
  const uint64_t joined = reads.joined.load(std::memory_order_relaxed);
  const uint64_t miss = reads.miss.load(std::memory_order_relaxed);
  const uint64_t all = ready + joined + miss;
  const prefetch::StallHistogram& stall = reads.stall;
  nlohmann::ordered_json predictors = nlohmann::ordered_json::array();
  for (const prefetch::PredictorReport& p : e.predictors) {
    predictors.push_back(
        {{"name", p.name}, {"score", p.score}, {"foreseen", p.foreseen}, {"scored", p.scored}});
  }
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const prefetch::NodeInflightReport& n : e.nodes) {
    const prefetch::NodeWindowReport& w = n.window;
    nodes.push_back({{"address", n.address},
                     {"replica", n.replica},
                     {"inflight", w.inflight},
                     {"held", w.held},
                     {"limit", w.limit},
                     {"peak", w.peak},
                     {"sent", w.sent},
                     {"opened_for_plan", w.opened_for_plan},
                     {"rtt_ms", w.rtt_ms},
                     {"base_rtt_ms", w.base_rtt_ms},
                     {"burst_per_s", w.burst_per_s}});
  }
  return {
      {"mode", std::string(prefetch::prefetch_mode_name(e.mode))},
      {"leader", e.leader},
      {"epoch", e.epoch},
      {"accesses", e.accesses},
      {"reads",
       {{"ready", ready},
        {"joined", joined},
        {"miss", miss},
        {"hit_rate", all == 0 ? 0.0 : static_cast<double>(ready + joined) / all}}},
      {"stall_us",
       {{"p50", stall.quantile_us(0.5)},
        {"p90", stall.quantile_us(0.9)},
        {"p99", stall.quantile_us(0.99)},
        {"p999", stall.quantile_us(0.999)},
        {"max", stall.max_us()},
        {"total_s", stall.total_s()}}},
      {"bytes",
       {{"prefetched", c.prefetched_bytes}, {"used", c.used_bytes}, {"wasted", c.wasted_bytes}}},
      {"inflight",
       {{"objects", e.inflight_objects},
        {"bytes", e.inflight_bytes},
        {"target", e.inflight_limit},
        {"max", e.inflight_max},
        {"peak", e.inflight_peak},
        {"held", e.inflight_held},
        {"fetches_opened_for_plan", e.fetches_opened_for_plan},
        {"guesses_held_back", e.guesses_held_back},
        {"near_rechecks", e.near_rechecks},
        {"base_rtt_ms", e.base_rtt_ms},
        {"burst_per_s", e.burst_per_s}}},
      {"rtt_ms", e.rtt_ms},
      {"nodes", nodes},
      {"consumption_files_per_s", e.files_per_s},
      {"connections", e.connections},
      {"gets", e.gets},
      {"disk_reads", e.disk_reads},
      {"disk_staging",
       {{"threads", e.disk_stagers},
        {"objects", e.staging},
        {"peak", e.staging_peak},
        {"passed_on", e.passed_for_stagers},
        {"passed_on_peak", e.passed_for_stagers_peak},
        {"before_first_read", e.staged_before_first_read}}},
      {"failures", e.failures},
      {"plan",
       {{"entries", e.plan_entries},
        {"unresolved", plan_unresolved},
        {"position", e.plan_position},
        {"writers", e.plan_writers},
        {"dropped", e.plan_entries_dropped}}},
      {"predictors", predictors},
  };
}

// null when the mount has no disk tier.
nlohmann::ordered_json disk_tier_json(const std::optional<prefetch::DiskTierStats>& tier) {
  if (!tier) return nullptr;
  const prefetch::DiskTierStats& t = *tier;
  return {{"capacity_bytes", t.capacity_bytes},
          {"bytes_used", t.bytes_used},
          {"entries", t.entries},
          {"hits", t.hits},
          {"misses", t.misses},
          {"bytes_read", t.bytes_read},
          {"writes", t.writes},
          {"bytes_written", t.bytes_written},
          {"writes_deferred", t.writes_deferred},
          {"writes_dropped", t.writes_dropped},
          {"writes_declined", t.writes_declined},
          {"write_errors", t.write_errors},
          {"checksum_failures", t.checksum_failures},
          {"stale_drops", t.stale_drops},
          {"read_errors", t.read_errors},
          {"direct_io", t.direct_io},
          {"page_cache_reads", t.page_cache_reads},
          {"direct_reads", t.direct_reads},
          {"evictions", t.evictions},
          {"files_reused", t.files_reused},
          {"too_large", t.too_large},
          {"queued_bytes", t.queued_bytes},
          {"stale_temp_files", t.stale_temp_files},
          {"index_loaded", t.index_loaded},
          {"open_seconds", t.open_seconds}};
}

nlohmann::ordered_json views_json(const ViewStats& v) {
  nlohmann::ordered_json json = {
      {"backend", v.backend},
      {"specs", v.specs},
      {"rendered", v.rendered},
      {"render_errors", v.render_errors},
      {"header_reads", v.header_reads},
      {"bytes_read", v.bytes_read},
      {"render_seconds", v.render_seconds},
      {"fetch_seconds", v.fetch_seconds},
      {"decode_seconds", v.service.decode_seconds},
      {"transform_seconds", v.service.transform_seconds},
      {"transform_errors", v.service.transform_errors},
      {"batches", v.service.batches},
      {"batched_images", v.service.batched_images},
      {"render_memory",
       {{"capacity_bytes", v.service.memory_capacity},
        {"peak_bytes", v.service.memory_peak},
        {"refused", v.service.memory_refused},
        {"timed_out", v.service.memory_timed_out}}},
      {"reads",
       {{"ready", v.reads_ready},
        {"joined", v.reads_joined},
        {"miss", v.reads_miss},
        {"ready_rate",
         v.reads_ready + v.reads_joined + v.reads_miss == 0
             ? 0.0
             : static_cast<double>(v.reads_ready) /
                   static_cast<double>(v.reads_ready + v.reads_joined + v.reads_miss)}}},
      {"ahead",
       {{"threads", v.ahead.threads},
        {"queued", v.ahead.queued},
        {"offered", v.ahead.offered},
        {"rendered", v.ahead.rendered},
        {"already", v.ahead.already},
        {"dropped", v.ahead.dropped},
        {"unordered", v.ahead.unordered},
        {"errors", v.ahead.errors},
        {"seconds", v.ahead.seconds}}},
      {"cache", cache_json(v.cache)},
  };
  if (v.cuda) {
    const view::CudaStageTimes& t = v.cuda->times;
    json["cuda"] = {{"device", v.cuda->device},
                    {"launches", t.launches},
                    {"images", t.images},
                    {"plan_seconds", t.plan_seconds},
                    {"wait_seconds", t.wait_seconds},
                    {"pack_seconds", t.pack_seconds},
                    {"upload_seconds", t.upload_seconds},
                    {"kernel_seconds", t.kernel_seconds},
                    {"download_seconds", t.download_seconds},
                    {"unpack_seconds", t.unpack_seconds}};
  }
  return json;
}

}  // namespace

namespace {

nlohmann::ordered_json watch_json(const WatchStats& w, const WatchOptions& options) {
  nlohmann::ordered_json pending = nlohmann::ordered_json::object();
  for (const auto& [name, generation] : w.pending) pending[name] = generation;
  return {{"interval_s", static_cast<double>(options.interval.count()) / 1000.0},
          {"follow_updates", options.follow_updates},
          {"passes", w.polls},
          {"failures", w.poll_failures},
          {"added", w.added},
          {"removed", w.removed},
          {"refreshed", w.refreshed},
          {"pending", pending}};
}

}  // namespace

std::string render_stats_json(const StatsSources& sources) {
  auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  nlohmann::ordered_json requests = nlohmann::ordered_json::object();
  uint64_t total_requests = 0;
  for (size_t i = 0; i < static_cast<size_t>(Op::kCount); ++i) {
    const uint64_t n = load(sources.fs.requests[i]);
    requests[std::string(op_name(static_cast<Op>(i)))] = n;
    total_requests += n;
  }
  nlohmann::ordered_json errors = nlohmann::ordered_json::object();
  for (size_t i = 0; i < static_cast<size_t>(ErrorKind::kCount); ++i) {
    errors[std::string(error_kind_name(static_cast<ErrorKind>(i)))] = load(sources.fs.errors[i]);
  }
  const prefetch::FetcherStats& f = sources.fetcher;
  errors["missing_objects"] = load(f.missing);
  errors["length_mismatches"] = load(f.length_mismatches);
  errors["checksum_mismatches"] = load(f.checksum_mismatches);
  errors["view_render"] = sources.views.render_errors;

  nlohmann::ordered_json datasets = nlohmann::ordered_json::object();
  for (const prefetch::DatasetSnapshot* d : sources.datasets) {
    datasets[d->name()] = {{"generation", d->generation()},
                           {"files", d->catalog->file_count()},
                           {"bytes", d->catalog->total_bytes()},
                           {"catalog_memory_bytes", d->catalog->memory_bytes()}};
  }
  const prefetch::CacheStats& c = sources.cache;
  const double uptime =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sources.started).count();
  nlohmann::ordered_json json = {
      {"uptime_s", uptime},
      {"namespace", std::string(sources.ns)},
      {"redis", std::string(sources.redis_endpoint)},
      {"requests", requests},
      {"requests_total", total_requests},
      {"files_read", load(sources.fs.files_read)},
      {"bytes_read", load(sources.fs.bytes_read)},
      {"redis_ops",
       {{"round_trips", load(f.round_trips)},
        {"gets", load(f.gets)},
        {"bytes", load(f.bytes)},
        {"retries", load(f.retries)},
        {"connects", sources.redis_connects}}},
      {"errors", errors},
      {"cache", cache_json(c)},
      {"disk_tier", disk_tier_json(sources.disk_tier)},
      {"prefetch", prefetch_json(sources.reads, sources.prefetch, c, sources.plan_unresolved)},
      {"views", views_json(sources.views)},
      {"datasets", datasets},
      {"watch", watch_json(sources.watch, sources.watch_options)},
      {"memory",
       {{"rss_bytes", sources.resident_bytes},
        {"trims", sources.memory.trims},
        {"released_bytes", sources.memory.released_bytes},
        {"buffer_reuse",
         {{"limit_bytes", sources.buffer_reuse.limit_bytes},
          {"held_bytes", sources.buffer_reuse.held_bytes},
          {"reused", sources.buffer_reuse.reused},
          {"allocated", sources.buffer_reuse.allocated}}}}},
  };
  return json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace dsfs::fs
