#include "src/catalog/dataset.h"

#include <fmt/core.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>
#include <map>
#include <optional>
#include <random>

#include "src/catalog/manifest.h"
#include "src/catalog/names.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"

namespace dsfs::catalog {
namespace {

constexpr std::string_view kScanBatch = "1000";
constexpr size_t kUnlinkWindow = 256;  // one-key UNLINKs outstanding per node
constexpr size_t kExistsWindow = 64;
constexpr size_t kManifestWriteWindow = 4;  // 8 MiB values: a few in flight is plenty
constexpr size_t kManifestReadWindow = 4;
constexpr uint64_t kMaxManifestChunks = 1u << 16;  // 512 GiB of manifest: beyond is corruption
constexpr uint64_t kMaxRedisStringBytes = 512ull << 20;
// pin_current_generation gives up after this many publishes racing with it.
constexpr int kMaxPinAttempts = 10;
// publish gives up after this many concurrent changes of the info hash.
constexpr int kMaxPublishAttempts = 10;

std::string hex64(uint64_t value) {
  return fmt::format("{:016x}", value);
}

std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

[[noreturn]] void throw_not_found(const store::Client& client, const KeySchema& keys,
                                  std::string_view name) {
  throw DatasetNotFound(
      fmt::format("dataset '{}' not found in namespace '{}' on {}; see `dsfs list`", name,
                  keys.ns(), client.describe()));
}

// The info field `dsfs rm` sets first, to the unix time it began.
constexpr std::string_view kRemovingField = "removing";

// A unix time in seconds as "YYYY-MM-DD HH:MM:SS UTC"; text that is not one, as "an unknown
// time" (it comes from Redis).
std::string format_unix_time(std::string_view seconds) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(seconds.data(), seconds.data() + seconds.size(), value);
  if (error != std::errc() || end != seconds.data() + seconds.size()) return "an unknown time";
  return store::utc_time_text(value);
}

[[noreturn]] void throw_corrupt_info(std::string_view name, std::string_view problem) {
  throw DatasetDamaged(fmt::format(
      "dataset '{}' has a corrupt info hash ({}); remove it with `dsfs rm {}` and ingest it again",
      name, problem, name));
}

// The whole of `text` as a number; nullopt for anything else (empty, sign, junk, overflow).
template <typename T>
std::optional<T> parse_number(std::string_view text, int base = 10) {
  T value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// Field `field` of the info hash of dataset `name`.
template <typename T = uint64_t>
T parse_field(std::string_view name, std::string_view field, std::string_view text, int base = 10) {
  const std::optional<T> value = parse_number<T>(text, base);
  if (!value) {
    throw_corrupt_info(
        name, fmt::format("field '{}' is '{}', not a number", field, store::log_text(text, 40)));
  }
  return *value;
}

std::vector<std::string> string_elements(const store::Reply& reply, std::string_view context) {
  reply.expect_ok(context);
  std::vector<std::string> out;
  out.reserve(reply.size());
  for (size_t i = 0; i < reply.size(); ++i) {
    out.emplace_back(store::Reply::element_str(reply.element(i)));
  }
  return out;
}

// SCANs for `pattern` on every primary (a cluster's keys are spread over its nodes) and UNLINKs
// each batch found (UNLINK frees values off the main thread), so Redis is never blocked for
// long. Adds deletions to `deleted`, reporting after each batch.
//
// Each round takes one SCAN step on every node not walked through yet, then UNLINKs what it
// found through the client, one key per command (a multi-key UNLINK across slots fails with
// CROSSSLOT), holding no node's connection meanwhile. for_each_primary may run a round's steps
// again after a failover and SCAN may return a key twice: UNLINK counts only the keys it really
// removed, so `deleted` stays right.
void unlink_matching(store::Client& client, const std::string& pattern, uint64_t& deleted,
                     const std::function<void(uint64_t)>& progress) {
  std::map<std::string, std::string> cursors;  // node -> where its SCAN goes on; "0" once done
  for (;;) {
    std::vector<std::array<std::string, 2>> unlinks;
    bool more = false;
    client.for_each_primary([&](store::Connection& conn) {
      const auto [at, first_visit] = cursors.try_emplace(conn.endpoint().describe(), "0");
      std::string& cursor = at->second;
      if (cursor == "0" && !first_visit) return;  // walked through
      store::Reply scan = conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", kScanBatch});
      scan.expect_ok(fmt::format("SCAN MATCH {} on {}", pattern, conn.endpoint().describe()));
      const redisReply* cursor_reply = scan.element(0);
      const redisReply* keys_reply = scan.element(1);
      if (scan.size() != 2 || !keys_reply || keys_reply->type != REDIS_REPLY_ARRAY) {
        throw store::ReplyError(fmt::format("SCAN MATCH {} on {}: unexpected reply shape", pattern,
                                            conn.endpoint().describe()));
      }
      cursor = std::string(store::Reply::element_str(cursor_reply));
      if (cursor.empty()) cursor = "0";
      if (cursor != "0") more = true;
      for (size_t i = 0; i < keys_reply->elements; ++i) {
        unlinks.push_back(
            {"UNLINK", std::string(store::Reply::element_str(keys_reply->element[i]))});
      }
    });
    if (!unlinks.empty()) {
      std::string problem;
      client.pipeline(unlinks, kUnlinkWindow, [&](size_t index, store::Reply& reply) {
        if (reply.is_error()) {
          if (problem.empty()) {
            problem = fmt::format("UNLINK {}: Redis replied '{}'", unlinks[index][1], reply.str());
          }
          return;
        }
        deleted += static_cast<uint64_t>(reply.integer());
      });
      if (!problem.empty()) throw store::ReplyError(problem);
      if (progress) progress(deleted);
    }
    if (!more) return;
  }
}

bool manifest_exists(store::Client& client, const KeySchema& keys, const std::string& name,
                     uint64_t gen) {
  return client.command({"EXISTS", keys.manifest_chunk(name, gen, 0)})
             .expect_ok("EXISTS manifest")
             .integer() > 0;
}

// Milliseconds since the epoch by the clock of the Redis server that holds `key` (the
// dataset's readers set), so that leases written and checked from different hosts agree on
// when they expire whatever the hosts' clocks say; on a cluster every host asks that same node.
// TIME names no key, so it runs on a connection leased for the key's node; a node that does not
// answer is retried (the map reloaded) within the client's retry budget.
int64_t server_time_ms(store::Client& client, std::string_view key) {
  store::Backoff backoff(client.options().retry_budget);
  for (;;) {
    store::Reply time;
    try {
      store::ConnectionPool::Lease lease = client.lease_for_key(key);
      time = lease->command({"TIME"});
    } catch (const store::ConnectionError&) {
      if (!backoff.wait()) throw;
      try {
        client.refresh_topology();
      } catch (const store::ConnectionError& e) {
        spdlog::debug("TIME: {}", e.what());
      }
      continue;
    }
    time.expect_ok("TIME");
    if (time.size() != 2) throw store::ReplyError("TIME: unexpected reply shape");
    int64_t parts[2] = {0, 0};  // seconds, microseconds
    for (size_t i = 0; i < 2; ++i) {
      const std::string_view text = store::Reply::element_str(time.element(i));
      const auto part = parse_number<int64_t>(text);
      if (!part) throw store::ReplyError(fmt::format("TIME: '{}' is not a number", text));
      parts[i] = *part;
    }
    return parts[0] * 1000 + parts[1] / 1000;
  }
}

// Between WATCH and EXEC on a pooled connection: sends UNWATCH if the flip stops before EXEC,
// so the connection goes back to the pool without a WATCH that would abort its next user's
// transaction.
class WatchGuard {
 public:
  explicit WatchGuard(store::Connection& conn) : conn_(conn) {}
  ~WatchGuard() {
    // With replies pending (thrown mid-transaction) the pool drops the connection anyway.
    if (!armed_ || conn_.broken() || conn_.pending() != 0) return;
    try {
      conn_.command({"UNWATCH"});
    } catch (const std::exception& e) {
      spdlog::debug("UNWATCH on {}: {}", conn_.endpoint().describe(), e.what());
    }
  }
  WatchGuard(const WatchGuard&) = delete;
  WatchGuard& operator=(const WatchGuard&) = delete;
  void disarm() { armed_ = false; }  // EXEC ran: it ended the WATCH

 private:
  store::Connection& conn_;
  bool armed_ = true;
};

// A lease's member in the readers set; the generation comes first so GC can parse it whatever
// characters the reader id holds.
std::string lease_member(uint64_t gen, std::string_view reader_id) {
  return fmt::format("{}:{}", gen, reader_id);
}

// One try of publish's flip on the primary of the dataset's slot: WATCH info and gens, check the
// generation, then MULTI/HSET/EXEC. True once committed. False when it must be tried again:
// with `unsettled_reply` set when a step got a reply that store::must_retry_reply says means the
// slot is moving (nothing was committed), empty when the WATCH aborted EXEC (a concurrent change).
// Throws for anything else (a newer generation published, the generation no longer recorded,
// any other error reply).
bool flip_generation(store::Client& client, const std::string& name, const std::string& info_key,
                     const std::string& gens_key, const std::string& published_key,
                     DatasetInfo& info, std::string& unsettled_reply) {
  const auto settled = [&](const store::Reply& reply) {
    if (!reply.is_error() || !store::must_retry_reply(reply.str())) return true;
    unsettled_reply = reply.str();
    return false;
  };
  store::ConnectionPool::Lease lease = client.lease_for_key(info_key);
  store::Connection& conn = *lease;
  // gens is watched too: an rm that deletes it meanwhile aborts the flip.
  const store::Reply watched = conn.command({"WATCH", info_key, gens_key});
  if (!settled(watched)) return false;
  watched.expect_ok("WATCH info gens");
  WatchGuard watch(conn);
  const store::Reply current =
      conn.command({"HMGET", info_key, "generation", std::string(kRemovingField)});
  if (!settled(current)) return false;
  current.expect_ok("HMGET generation removing");
  if (current.size() != 2) {
    throw store::ReplyError(fmt::format("HMGET {}: unexpected reply shape", info_key));
  }
  if (current.element(1)->type == REDIS_REPLY_STRING) {
    throw std::runtime_error(fmt::format(
        "dataset '{}' is being removed (a `dsfs rm` began and has not finished); finish it with "
        "`dsfs rm {}`, then ingest again",
        name, name));
  }
  const redisReply* generation_field = current.element(0);
  const uint64_t current_generation =
      generation_field->type != REDIS_REPLY_STRING
          ? 0
          : parse_field(name, "generation", store::Reply::element_str(generation_field));
  if (current_generation > info.generation) {
    throw std::runtime_error(fmt::format(
        "dataset '{}': generation {} was published while this one ({}) was being written; "
        "keeping the newer one (this generation's keys are collected later)",
        name, current_generation, info.generation));
  }
  // begin_generation recorded G in gens; if it is gone, `dsfs rm` or a Redis that lost data
  // (a restart without persistence) took objects of G with it: publishing would expose a
  // dataset with missing files.
  const store::Reply recorded =
      conn.command({"SISMEMBER", gens_key, std::to_string(info.generation)});
  if (!settled(recorded)) return false;
  if (recorded.expect_ok("SISMEMBER gens").integer() == 0) {
    throw std::runtime_error(fmt::format(
        "dataset '{}': generation {} is no longer recorded in {}: the dataset was removed "
        "(`dsfs rm`) or Redis lost data while it was being written, so its objects may be "
        "incomplete; ingest it again",
        name, info.generation, gens_key));
  }
  info.previous_generation =
      current_generation == info.generation ? info.previous_generation : current_generation;
  const std::array<std::pair<std::string_view, std::string>, 14> fields = {{
      {"name", name},
      {"schema_version", std::to_string(info.schema_version)},
      {"generation", std::to_string(info.generation)},
      {"previous_generation", std::to_string(info.previous_generation)},
      {"file_count", std::to_string(info.file_count)},
      {"dir_count", std::to_string(info.dir_count)},
      {"total_bytes", std::to_string(info.total_bytes)},
      {"class_count", std::to_string(info.class_count)},
      {"created_unix", std::to_string(info.created_unix)},
      {"source", info.source},
      {"chunk_size", std::to_string(info.chunk_size)},
      {"manifest_chunks", std::to_string(info.manifest_chunks)},
      {"manifest_bytes", std::to_string(info.manifest_bytes)},
      {"manifest_xxh64", hex64(info.manifest_xxh64)},
  }};
  std::vector<std::string_view> hset = {"HSET", info_key};
  for (const auto& [key, value] : fields) {
    hset.push_back(key);
    hset.push_back(value);
  }
  // The published set records, with the flip, that G was current: GC keeps only such
  // generations as "previous" (a manifest alone is also left by an ingest killed before its
  // flip). The generation current until now goes in too, for datasets published before the set.
  const std::string generation = std::to_string(info.generation);
  const std::string previous = std::to_string(current_generation);
  std::vector<std::string_view> sadd = {"SADD", published_key, generation};
  if (current_generation != 0) sadd.push_back(previous);
  conn.append({"MULTI"});
  conn.append(std::span<const std::string_view>(hset));
  conn.append(std::span<const std::string_view>(sadd));
  conn.append({"EXEC"});
  const store::Reply multi = conn.read_reply();
  const store::Reply queued_hset = conn.read_reply();
  const store::Reply queued_sadd = conn.read_reply();
  const store::Reply exec = conn.read_reply();
  watch.disarm();  // EXEC (or its refusal) ended the WATCH
  if (!settled(multi) || !settled(queued_hset) || !settled(queued_sadd) || !settled(exec)) {
    return false;
  }
  multi.expect_ok("MULTI");
  queued_hset.expect_ok("HSET info");
  queued_sadd.expect_ok("SADD published");
  exec.expect_ok("EXEC");
  return !exec.is_nil();  // nil: the WATCH aborted it
}

}  // namespace

std::vector<std::string> list_datasets(store::Client& client, const KeySchema& keys,
                                       std::vector<std::string>* unpublished) {
  auto names = string_elements(client.command({"SMEMBERS", keys.datasets()}),
                               fmt::format("SMEMBERS {}", keys.datasets()));
  // begin_generation adds a name before its first publish (so a crash between the info flip
  // and anything after it cannot hide a published dataset); only names with info are published.
  std::vector<std::vector<std::string>> exists;
  exists.reserve(names.size());
  for (const std::string& name : names) exists.push_back({"EXISTS", keys.info(name)});
  std::vector<std::string> published;
  // Each dataset's info lives on its own slot: replies come in any order, hence the sort.
  client.pipeline(exists, kExistsWindow, [&](size_t i, const store::Reply& reply) {
    reply.expect_ok("EXISTS info");
    if (reply.integer() != 0) {
      published.push_back(names[i]);
    } else if (unpublished) {
      unpublished->push_back(names[i]);
    }
  });
  std::sort(published.begin(), published.end());
  if (unpublished) std::sort(unpublished->begin(), unpublished->end());
  return published;
}

std::vector<DatasetStatus> list_dataset_status(store::Client& client, const KeySchema& keys,
                                               std::vector<std::string>* unpublished) {
  std::vector<DatasetStatus> statuses;
  for (const std::string& name : list_datasets(client, keys, unpublished)) {
    DatasetStatus& status = statuses.emplace_back();
    status.name = store::log_text(name);
    try {
      status.info = read_info(client, keys, name);
    } catch (const DatasetNotFound&) {
      statuses.pop_back();  // removed since it was listed
    } catch (const DatasetDamaged& e) {
      status.damage = e.what();
    } catch (const store::ConnectionError&) {
      throw;
    } catch (const std::runtime_error& e) {  // a newer schema version, an error reply
      status.damage = store::log_text(e.what());
    }
  }
  // The manifest each healthy dataset's current generation names: one pipelined round.
  std::vector<DatasetStatus*> healthy;
  std::vector<std::array<std::string, 2>> exists;
  for (DatasetStatus& status : statuses) {
    if (!status.info) continue;
    healthy.push_back(&status);
    exists.push_back({"EXISTS", keys.manifest_chunk(status.name, status.info->generation, 0)});
  }
  client.pipeline(exists, kExistsWindow, [&](size_t i, const store::Reply& reply) {
    reply.expect_ok("EXISTS manifest");
    if (reply.integer() != 0) return;
    DatasetStatus& status = *healthy[i];
    status.damage = fmt::format(
        "dataset '{}' is damaged: the manifest of its generation {} ({}) is missing; remove it "
        "with `dsfs rm {}` and ingest it again",
        status.name, status.info->generation, exists[i][1], status.name);
    status.info.reset();
  });
  return statuses;
}

DatasetInfo read_info(store::Client& client, const KeySchema& keys, const std::string& name) {
  // A name not valid here came from the datasets set (a caller validates what a user typed):
  // damaged like any other bad record, so that a mount of every dataset, the watcher and
  // `refresh` skip it rather than fail for all (std::invalid_argument is no runtime_error).
  if (!is_valid_dataset_name(name)) {
    throw DatasetDamaged(fmt::format(
        "{} names '{}', which is not a valid dataset name, so not written by dsfs; remove it "
        "from the set with `redis-cli SREM {} NAME`",
        keys.datasets(), store::log_text(name), keys.datasets()));
  }
  store::Reply reply = client.command({"HGETALL", keys.info(name)});
  if (reply.is_error() && reply.str().starts_with("WRONGTYPE")) {
    throw_corrupt_info(name, fmt::format("{} is not a hash", keys.info(name)));
  }
  const auto flat = string_elements(reply, fmt::format("HGETALL {}", keys.info(name)));
  if (flat.empty()) throw_not_found(client, keys, name);
  return parse_info(name, flat);
}

DatasetInfo parse_info(const std::string& name, const std::vector<std::string>& flat) {
  if (flat.size() % 2 != 0) throw_corrupt_info(name, "odd HGETALL reply");
  std::map<std::string, std::string, std::less<>> fields;
  for (size_t i = 0; i + 1 < flat.size(); i += 2) fields[flat[i]] = flat[i + 1];

  auto field = [&](std::string_view key) -> const std::string& {
    const auto it = fields.find(key);
    if (it == fields.end()) throw_corrupt_info(name, fmt::format("field '{}' is missing", key));
    return it->second;
  };
  auto optional_unsigned = [&](std::string_view key) -> uint64_t {
    const auto it = fields.find(key);
    return it == fields.end() ? 0 : parse_field(name, key, it->second);
  };

  if (const auto it = fields.find(kRemovingField); it != fields.end()) {
    throw DatasetDamaged(fmt::format(
        "dataset '{}' is being removed (a `dsfs rm` began at {} and has not finished; if it was "
        "interrupted, run `dsfs rm {}` again)",
        name, format_unix_time(it->second), name));
  }
  DatasetInfo info;
  info.name = name;
  const uint64_t version = parse_field(name, "schema_version", field("schema_version"));
  if (version > kSchemaVersion) {
    throw std::runtime_error(fmt::format(
        "dataset '{}' uses schema version {}, newer than this dsfs supports ({}); upgrade dsfs",
        name, version, kSchemaVersion));
  }
  if (version == 0) throw_corrupt_info(name, "schema_version is 0");
  info.schema_version = static_cast<uint32_t>(version);
  info.generation = parse_field(name, "generation", field("generation"));
  if (info.generation == 0) throw_corrupt_info(name, "generation is 0");
  info.previous_generation = optional_unsigned("previous_generation");
  info.file_count = parse_field(name, "file_count", field("file_count"));
  info.dir_count = optional_unsigned("dir_count");
  info.total_bytes = parse_field(name, "total_bytes", field("total_bytes"));
  info.class_count = optional_unsigned("class_count");
  if (const auto it = fields.find("created_unix"); it != fields.end()) {
    info.created_unix = parse_field<int64_t>(name, "created_unix", it->second);
  }
  if (const auto it = fields.find("source"); it != fields.end()) info.source = it->second;
  info.chunk_size = parse_field(name, "chunk_size", field("chunk_size"));
  if (info.chunk_size == 0) throw_corrupt_info(name, "chunk_size is 0");
  info.manifest_chunks = parse_field(name, "manifest_chunks", field("manifest_chunks"));
  info.manifest_bytes = parse_field(name, "manifest_bytes", field("manifest_bytes"));
  const std::string& hash = field("manifest_xxh64");
  if (hash.size() != 16) {
    throw_corrupt_info(
        name, fmt::format("manifest_xxh64 '{}' is not 16 hex digits", store::log_text(hash, 40)));
  }
  info.manifest_xxh64 = parse_field(name, "manifest_xxh64", hash, 16);
  return info;
}

std::shared_ptr<const Catalog> load_catalog(store::Client& client, const KeySchema& keys,
                                            const DatasetInfo& info) {
  const std::string& name = info.name;
  const auto where = [&] {
    return fmt::format("dataset '{}' generation {}", name, info.generation);
  };
  if (info.manifest_chunks == 0 || info.manifest_chunks > kMaxManifestChunks ||
      info.manifest_bytes > info.manifest_chunks * kMaxRedisStringBytes) {
    throw ManifestError(
        fmt::format("{}: info lists {} manifest chunks holding {} bytes, which is "
                    "impossible; the info hash is corrupt",
                    where(), info.manifest_chunks, info.manifest_bytes));
  }
  std::vector<std::array<std::string, 2>> commands;
  commands.reserve(info.manifest_chunks);
  for (uint64_t i = 0; i < info.manifest_chunks; ++i) {
    commands.push_back({"GET", keys.manifest_chunk(name, info.generation, i)});
  }
  std::vector<std::byte> bytes;
  bytes.reserve(info.manifest_bytes);
  // Errors are noted, not thrown, inside the pipeline so every reply is read and the connection
  // stays usable. The chunks share the dataset's slot, so their replies come in order; one that
  // comes early (a chunk asked again after a redirection) waits in `early` until its turn.
  std::string problem;
  size_t next_chunk = 0;
  std::map<size_t, store::Reply> early;
  const auto take = [&](size_t index, const store::Reply& reply) {
    if (!problem.empty()) return;
    if (reply.is_error()) {
      problem = fmt::format("GET {}: Redis replied '{}'", commands[index][1], reply.str());
    } else if (reply.is_nil()) {
      problem = fmt::format(
          "manifest chunk {} ({}) is missing; the dataset was removed or replaced while loading "
          "(retry), or it is damaged (ingest it again)",
          index, commands[index][1]);
    } else if (bytes.size() + reply.str().size() > info.manifest_bytes) {
      problem = fmt::format("manifest chunks hold more than the {} bytes info lists",
                            info.manifest_bytes);
    } else {
      const auto* begin = reinterpret_cast<const std::byte*>(reply.str().data());
      bytes.insert(bytes.end(), begin, begin + reply.str().size());
    }
  };
  client.pipeline(commands, kManifestReadWindow, [&](size_t index, store::Reply& reply) {
    if (index != next_chunk) {
      early.emplace(index, std::move(reply));
      return;
    }
    take(index, reply);
    for (++next_chunk; !early.empty() && early.begin()->first == next_chunk; ++next_chunk) {
      take(next_chunk, early.begin()->second);
      early.erase(early.begin());
    }
  });
  if (!problem.empty()) throw ManifestError(fmt::format("{}: {}", where(), problem));
  if (bytes.size() != info.manifest_bytes) {
    throw ManifestError(fmt::format("{}: manifest is {} bytes, info lists {}", where(),
                                    bytes.size(), info.manifest_bytes));
  }
  const uint64_t hash = XXH64(bytes.data(), bytes.size(), 0);
  if (hash != info.manifest_xxh64) {
    throw ManifestError(fmt::format("{}: manifest xxh64 is {}, info lists {}; it is corrupt",
                                    where(), hex64(hash), hex64(info.manifest_xxh64)));
  }
  Catalog catalog;
  try {
    catalog = decode_manifest(bytes);
  } catch (const ManifestError& e) {
    throw ManifestError(fmt::format("{}: {}", where(), e.what()));
  }
  if (catalog.file_count() != info.file_count || catalog.total_bytes() != info.total_bytes ||
      catalog.chunk_size() != info.chunk_size) {
    throw ManifestError(
        fmt::format("{}: manifest holds {} files, {} bytes, chunk size {}; info lists {}, {}, {}",
                    where(), catalog.file_count(), catalog.total_bytes(), catalog.chunk_size(),
                    info.file_count, info.total_bytes, info.chunk_size));
  }
  return std::make_shared<const Catalog>(std::move(catalog));
}

namespace {

// The value of `field` in an INFO reply ("field:value" lines); empty when absent.
std::string info_field(std::string_view text, std::string_view field) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find_first_of("\r\n", at), text.size());
    const std::string_view line = text.substr(at, end - at);
    if (line.size() > field.size() && line.starts_with(field) && line[field.size()] == ':') {
      return std::string(line.substr(field.size() + 1));
    }
    at = end + 1;
  }
  return {};
}

}  // namespace

std::string eviction_risk(store::Client& client, bool* limited) {
  std::string risk;
  client.for_each_primary([&](store::Connection& conn) {
    if (!risk.empty()) return;
    const store::Reply reply = conn.command({"INFO", "memory"});
    if (!reply.is_string()) return;  // INFO not allowed (an ACL, a managed service)
    const std::string policy = info_field(reply.str(), "maxmemory_policy");
    if (!policy.starts_with("allkeys-")) return;
    const std::string maxmemory = info_field(reply.str(), "maxmemory");
    if (limited) *limited = !maxmemory.empty() && maxmemory != "0";
    risk = fmt::format("Redis at {} evicts any key when full (maxmemory-policy {}, maxmemory {})",
                       conn.endpoint().describe(), policy,
                       maxmemory.empty() || maxmemory == "0" ? std::string("not set") : maxmemory);
  });
  return risk;
}

uint64_t begin_generation(store::Client& client, const KeySchema& keys, const std::string& name) {
  validate_new_dataset_name(name);
  // A generation number is the Redis server's time in microseconds when the ingest began (one
  // more than the last, if that is later): never one a mount or a disk cache may still hold
  // objects of, even after Redis lost the counter (FLUSHALL, a restart without persistence or
  // from an older snapshot) and the dataset was made again. A plain counter started again at 1,
  // and a mount that had generation 1's chunks cached served files mixing both datasets' bytes.
  const long long gen =
      client
          .command({"EVAL",
                    "redis.replicate_commands() "
                    "local now = redis.call('TIME') "
                    "local us = tonumber(now[1]) * 1000000 + tonumber(now[2]) "
                    "local gen = redis.call('INCR', KEYS[1]) "
                    "if gen < us then redis.call('SET', KEYS[1], string.format('%.0f', us)) "
                    "gen = us end "
                    "return gen",
                    "1", keys.next_generation(name)})
          .expect_ok("EVAL (the generation number: INCR and TIME)")
          .integer();
  // Recorded before any object is written, so GC and rm always find this generation's keys.
  client.command({"SADD", keys.generations(name), std::to_string(gen)}).expect_ok("SADD gens");
  // Listed from now on, but list_datasets shows it only once its info exists (published).
  client.command({"SADD", keys.datasets(), name}).expect_ok("SADD datasets");
  return static_cast<uint64_t>(gen);
}

void publish(store::Client& client, const KeySchema& keys, DatasetInfo& info,
             const Catalog& catalog, const std::function<void()>& before_flip) {
  validate_dataset_name(info.name);
  const std::string& name = info.name;
  if (info.generation == 0) {
    throw std::invalid_argument(
        fmt::format("publish '{}': no generation; call begin_generation first", name));
  }
  const std::vector<std::byte> manifest = encode_manifest(catalog);
  info.schema_version = kSchemaVersion;
  info.file_count = catalog.file_count();
  info.dir_count = catalog.directory_count();
  info.total_bytes = catalog.total_bytes();
  info.class_count = catalog.classes().size();
  info.chunk_size = catalog.chunk_size();
  info.manifest_bytes = manifest.size();
  info.manifest_chunks =
      std::max<uint64_t>(1, (manifest.size() + kManifestChunkSize - 1) / kManifestChunkSize);
  info.manifest_xxh64 = XXH64(manifest.data(), manifest.size(), 0);
  info.created_unix = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();

  std::vector<std::array<std::string_view, 3>> writes;
  std::vector<std::string> chunk_keys;
  chunk_keys.reserve(info.manifest_chunks);
  for (uint64_t i = 0; i < info.manifest_chunks; ++i) {
    chunk_keys.push_back(keys.manifest_chunk(name, info.generation, i));
  }
  const std::span<const std::byte> all(manifest);
  for (uint64_t i = 0; i < info.manifest_chunks; ++i) {
    const size_t offset = i * kManifestChunkSize;
    const size_t length = std::min<size_t>(kManifestChunkSize, manifest.size() - offset);
    writes.push_back({"SET", chunk_keys[i], as_text(all.subspan(offset, length))});
  }
  std::string problem;
  client.pipeline(writes, kManifestWriteWindow, [&](size_t index, store::Reply& reply) {
    if (reply.is_error() && problem.empty()) {
      problem = fmt::format("SET {}: Redis replied '{}'", chunk_keys[index], reply.str());
    }
  });
  if (!problem.empty()) {
    throw store::ReplyError(fmt::format("publish '{}': {}", name, problem));
  }
  if (before_flip) before_flip();

  // The flip: WATCH makes a concurrent publish of the same name abort ours instead of
  // interleaving; MULTI/EXEC replaces every field at once. info and gens share the dataset's
  // slot, so the whole sequence runs on one connection to that slot's primary.
  const std::string info_key = keys.info(name);
  const std::string gens_key = keys.generations(name);
  store::Backoff moved_backoff(client.options().retry_budget);
  // A step of the flip that meets the slot on the move (MOVED/ASK during a reshard or failover,
  // TRYAGAIN while its keys are split between two nodes, CLUSTERDOWN) cannot have committed (a
  // redirected command inside MULTI makes EXEC abort), so the whole flip runs again where the
  // slot lives now. It is idempotent: the same fields again.
  for (int attempt = 0;; ++attempt) {
    std::string unsettled_reply;
    if (flip_generation(client, name, info_key, gens_key, keys.published(name), info,
                        unsettled_reply)) {
      break;
    }
    if (!unsettled_reply.empty()) {
      if (!moved_backoff.wait()) {
        throw store::ConnectionError(
            fmt::format("publish '{}': the slot of {} kept moving ({}); try again", name, info_key,
                        store::log_text(unsettled_reply)));
      }
      spdlog::debug("publish '{}': the slot of {} is moving ({}), retrying", name, info_key,
                    store::log_text(unsettled_reply));
      client.refresh_topology();
      --attempt;  // not a concurrent publish: does not count against kMaxPublishAttempts
      continue;
    }
    if (attempt >= kMaxPublishAttempts) {
      throw std::runtime_error(
          fmt::format("dataset '{}': info kept changing during publish; try again", name));
    }
    spdlog::debug("publish '{}': info changed concurrently, retrying", name);
  }
  client.command({"SADD", keys.datasets(), name}).expect_ok("SADD datasets");
}

uint64_t collect_garbage(store::Client& client, const KeySchema& keys, const std::string& name,
                         unsigned keep_previous) {
  const DatasetInfo info = read_info(client, keys, name);
  std::vector<uint64_t> generations;
  for (const auto& text :
       string_elements(client.command({"SMEMBERS", keys.generations(name)}), "SMEMBERS gens")) {
    const auto gen = parse_number<uint64_t>(text);
    if (!gen) {
      spdlog::warn("dataset '{}': ignoring '{}' in {}: not a generation number", name, text,
                   keys.generations(name));
      continue;
    }
    generations.push_back(*gen);
  }
  // Generations that were ever current. One below the set's smallest member may be from before
  // the set existed: for those a manifest is the sign of a publish, as it was then.
  std::set<uint64_t> published;
  for (const auto& text :
       string_elements(client.command({"SMEMBERS", keys.published(name)}), "SMEMBERS published")) {
    if (const auto gen = parse_number<uint64_t>(text)) published.insert(*gen);
  }
  const auto was_published = [&](uint64_t gen) {
    if (published.contains(gen)) return true;
    if (!published.empty() && gen > *published.begin()) return false;
    return manifest_exists(client, keys, name, gen);
  };
  // Read after info: a reader that pinned the then-current generation before this point is
  // seen here, and one pinning later pins a generation >= info.generation, never collected.
  const std::set<uint64_t> pinned = pinned_generations(client, keys, name);
  // Newer generations than the current one belong to ingests still running (or failed ones,
  // collected after the next publish). Of the older ones, those pinned by a live reader's lease
  // stay, and so do the newest `keep_previous` published ones (readers without a lease).
  std::sort(generations.rbegin(), generations.rend());
  uint64_t deleted = 0;
  unsigned kept = 0;
  for (const uint64_t gen : generations) {
    if (gen >= info.generation) continue;
    if (pinned.contains(gen)) {
      spdlog::debug("dataset '{}': keeping generation {}, pinned by a mounted reader", name, gen);
      continue;
    }
    if (kept < keep_previous && was_published(gen)) {
      ++kept;
      continue;
    }
    deleted += delete_generation(client, keys, name, gen);
    spdlog::debug("dataset '{}': collected generation {}", name, gen);
  }
  return deleted;
}

bool forget_if_nothing_left(store::Client& client, const KeySchema& keys, const std::string& name) {
  validate_dataset_name(name);
  const long long left = client.command({"EXISTS", keys.info(name), keys.generations(name)})
                             .expect_ok("EXISTS")
                             .integer();
  if (left != 0) return false;
  return client.command({"SREM", keys.datasets(), name}).expect_ok("SREM datasets").integer() > 0;
}

uint64_t delete_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                           uint64_t gen) {
  validate_dataset_name(name);
  uint64_t deleted = 0;
  unlink_matching(client, keys.generation_objects_pattern(name, gen), deleted, {});
  unlink_matching(client, keys.generation_manifest_pattern(name, gen), deleted, {});
  client.command({"SREM", keys.published(name), std::to_string(gen)}).expect_ok("SREM published");
  client.command({"SREM", keys.generations(name), std::to_string(gen)}).expect_ok("SREM gens");
  return deleted;
}

uint64_t remove_dataset(store::Client& client, const KeySchema& keys, const std::string& name,
                        const std::function<void(uint64_t)>& progress) {
  validate_dataset_name(name);
  // Anything left by a publish, a failed ingest or an interrupted rm counts as existing, but
  // not the generation counter, which rm keeps. The dataset's own keys share one slot; the
  // datasets set is elsewhere on a cluster.
  const long long keys_present =
      client.command({"EXISTS", keys.info(name), keys.generations(name), keys.readers(name)})
          .expect_ok("EXISTS")
          .integer();
  const long long listed =
      client.command({"SISMEMBER", keys.datasets(), name}).expect_ok("SISMEMBER").integer();
  if (keys_present == 0 && listed == 0) throw_not_found(client, keys, name);

  // Marked first: a dataset whose objects are partly gone is then shown as being removed
  // (list, info, mount) instead of healthy with reads that fail, until an rm finishes. Only an
  // info hash that exists is marked (HSET would make one; a key of another type is damage
  // that rm removes as it is).
  if (keys_present > 0) {
    client
        .command({"EVAL",
                  "if redis.call('TYPE', KEYS[1]).ok == 'hash' then "
                  "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return 0",
                  "1", keys.info(name), kRemovingField,
                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count())})
        .expect_ok("mark info as being removed");
  }
  uint64_t deleted = 0;
  unlink_matching(client, keys.dataset_objects_pattern(name), deleted, progress);
  unlink_matching(client, keys.dataset_manifests_pattern(name), deleted, progress);
  // The generation counter stays: a dataset made again under this name must not reuse a
  // generation number of this one, which mounts and disk caches would take for its objects
  // (a key and a disk cache file are named by name, generation and object id).
  deleted += static_cast<uint64_t>(
      client.command({"UNLINK", keys.generations(name), keys.readers(name), keys.published(name)})
          .expect_ok("UNLINK gens")
          .integer());
  client.command({"SREM", keys.datasets(), name}).expect_ok("SREM datasets");
  // The info hash goes last: while it exists, an interrupted rm can simply be run again.
  deleted += static_cast<uint64_t>(
      client.command({"UNLINK", keys.info(name)}).expect_ok("UNLINK info").integer());
  if (progress) progress(deleted);
  return deleted;
}

std::string make_reader_id() {
  std::array<char, HOST_NAME_MAX + 1> host{};
  if (gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') {
    std::snprintf(host.data(), host.size(), "unknown-host");
  }
  std::random_device random;
  return fmt::format("{}:{}:{:08x}", host.data(), getpid(), random());
}

bool pin_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                    const std::string& reader_id, uint64_t gen, std::chrono::milliseconds ttl) {
  validate_dataset_name(name);
  if (reader_id.empty()) throw std::invalid_argument("pin_generation: empty reader id");
  if (ttl.count() <= 0) {
    throw std::invalid_argument(
        fmt::format("pin_generation: lease ttl must be positive, not {} ms", ttl.count()));
  }
  const std::string key = keys.readers(name);
  const int64_t expiry = server_time_ms(client, key) + ttl.count();
  const long long added =
      client.command({"ZADD", key, std::to_string(expiry), lease_member(gen, reader_id)})
          .expect_ok(fmt::format("ZADD {}", key))
          .integer();
  return added > 0;
}

void unpin_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                      const std::string& reader_id, uint64_t gen) {
  validate_dataset_name(name);
  client.command({"ZREM", keys.readers(name), lease_member(gen, reader_id)})
      .expect_ok(fmt::format("ZREM {}", keys.readers(name)));
}

DatasetInfo pin_current_generation(store::Client& client, const KeySchema& keys,
                                   const std::string& name, const std::string& reader_id,
                                   std::chrono::milliseconds ttl) {
  DatasetInfo info = read_info(client, keys, name);
  for (int attempt = 1;; ++attempt) {
    pin_generation(client, keys, name, reader_id, info.generation, ttl);
    DatasetInfo now;
    try {
      now = read_info(client, keys, name);
    } catch (...) {
      try {  // removed meanwhile (or Redis went away): do not leave the lease behind
        unpin_generation(client, keys, name, reader_id, info.generation);
      } catch (const std::exception& e) {
        spdlog::debug("dataset '{}': cannot unpin generation {}: {}", name, info.generation,
                      e.what());
      }
      throw;
    }
    // Still current after the pin: no collection, past or future, can delete it.
    if (now.generation == info.generation) return now;
    unpin_generation(client, keys, name, reader_id, info.generation);
    if (attempt >= kMaxPinAttempts) {
      throw std::runtime_error(
          fmt::format("dataset '{}': {} generations were published while pinning one; try again",
                      name, attempt));
    }
    info = std::move(now);
  }
}

std::vector<std::string> live_leases(store::Client& client, const KeySchema& keys,
                                     const std::string& name) {
  validate_dataset_name(name);
  const std::string key = keys.readers(name);
  const std::string now = std::to_string(server_time_ms(client, key));
  return string_elements(client.command({"ZRANGEBYSCORE", key, "(" + now, "+inf"}),
                         fmt::format("ZRANGEBYSCORE {}", key));
}

std::set<uint64_t> pinned_generations(store::Client& client, const KeySchema& keys,
                                      const std::string& name) {
  validate_dataset_name(name);
  const std::string key = keys.readers(name);
  const std::string now = std::to_string(server_time_ms(client, key));
  // An expiry at or before now has lapsed: drop those, and list the rest (in either order: the
  // listing names only expiries after now). One round trip to the key's node.
  const std::array<std::array<std::string, 4>, 2> commands = {{
      {"ZREMRANGEBYSCORE", key, "-inf", now},
      {"ZRANGEBYSCORE", key, "(" + now, "+inf"},
  }};
  std::array<store::Reply, 2> replies;
  client.pipeline(commands, commands.size(),
                  [&](size_t index, store::Reply& reply) { replies[index] = std::move(reply); });
  const store::Reply& dropped = replies[0];
  const store::Reply& live = replies[1];
  const long long expired = dropped.expect_ok(fmt::format("ZREMRANGEBYSCORE {}", key)).integer();
  if (expired > 0) spdlog::debug("dataset '{}': dropped {} expired lease(s)", name, expired);
  std::set<uint64_t> pinned;
  for (const std::string& member : string_elements(live, fmt::format("ZRANGEBYSCORE {}", key))) {
    const auto gen = parse_number<uint64_t>(std::string_view(member).substr(0, member.find(':')));
    if (!gen) {
      spdlog::warn("dataset '{}': ignoring lease '{}' in {}: not GEN:READER", name, member, key);
      continue;
    }
    pinned.insert(*gen);
  }
  return pinned;
}

}  // namespace dsfs::catalog
