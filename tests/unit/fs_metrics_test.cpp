// The Prometheus exposition of a mount's counters (fs/metrics.h): label escaping, the read-stall
// histogram's shape, agreement with stats.json; and the endpoint serving it
// (fs/metrics_server.h): addresses, a port in use, paths, methods, a stalled client.
#include <arpa/inet.h>
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fs/metrics.h"
#include "fs/metrics_server.h"
#include "fs/stats.h"
#include "src/catalog/catalog.h"

namespace dsfs::fs {
namespace {

using ::testing::HasSubstr;

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;  // values unescaped
  std::string value;
};

// What a scraper reads: every sample, and each family's # TYPE, failing the test on any line
// the text format does not allow.
struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::vector<std::string> family_order;
};

Exposition parse(const std::string& text) {
  Exposition out;
  const std::regex name_re("[a-zA-Z_:][a-zA-Z0-9_:]*");
  std::istringstream lines(text);
  std::string line;
  std::string family;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "the text must end with a newline";
  while (std::getline(lines, line)) {
    if (line.starts_with("# HELP ")) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(out.helped.insert(name).second) << "HELP twice for " << name;
      continue;
    }
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name;
      std::string type;
      words >> name >> type;
      EXPECT_TRUE(out.helped.contains(name)) << "TYPE before HELP for " << name;
      EXPECT_TRUE(out.types.emplace(name, type).second) << "TYPE twice for " << name;
      EXPECT_THAT(type, ::testing::AnyOf("counter", "gauge", "histogram")) << line;
      family = name;
      out.family_order.push_back(name);
      continue;
    }
    EXPECT_FALSE(line.starts_with('#')) << line;
    Sample sample;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    sample.name = line.substr(0, i);
    EXPECT_TRUE(std::regex_match(sample.name, name_re)) << line;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        EXPECT_NE(eq, std::string::npos) << line;
        if (eq == std::string::npos) return out;
        const std::string label = line.substr(i, eq - i);
        EXPECT_TRUE(std::regex_match(label, name_re)) << line;
        EXPECT_EQ(line[eq + 1], '"') << line;
        std::string value;
        size_t k = eq + 2;
        for (; k < line.size() && line[k] != '"'; ++k) {
          if (line[k] == '\\') {
            ++k;
            if (k == line.size()) break;
            EXPECT_THAT(std::string(1, line[k]), ::testing::AnyOf("\\", "\"", "n")) << line;
            value += line[k] == 'n' ? '\n' : line[k];
          } else {
            EXPECT_NE(line[k], '\n');
            value += line[k];
          }
        }
        EXPECT_LT(k, line.size()) << "unterminated label value: " << line;
        sample.labels[label] = value;
        i = k + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;  // '}'
    }
    EXPECT_LT(i, line.size()) << line;
    EXPECT_EQ(line[i], ' ') << line;
    sample.value = line.substr(i + 1);
    // Each sample belongs to the family whose TYPE came last.
    const bool belongs = sample.name == family ||
                         (out.types[family] == "histogram" &&
                          (sample.name == family + "_bucket" || sample.name == family + "_sum" ||
                           sample.name == family + "_count"));
    EXPECT_TRUE(belongs) << sample.name << " under family " << family;
    out.samples.push_back(std::move(sample));
  }
  return out;
}

std::vector<const Sample*> find(const Exposition& x, const std::string& name) {
  std::vector<const Sample*> found;
  for (const Sample& s : x.samples) {
    if (s.name == name) found.push_back(&s);
  }
  return found;
}

std::optional<std::string> value_of(const Exposition& x, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
  for (const Sample& s : x.samples) {
    if (s.name == name && s.labels == labels) return s.value;
  }
  return std::nullopt;
}

TEST(MetricsEscaping, BackslashQuoteAndNewline) {
  EXPECT_EQ(escape_label_value("plain-name_1.0"), "plain-name_1.0");
  EXPECT_EQ(escape_label_value("a\\b"), "a\\\\b");
  EXPECT_EQ(escape_label_value("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(escape_label_value("two\nlines"), "two\\nlines");
  EXPECT_EQ(escape_label_value("\\\"\n"), "\\\\\\\"\\n");
  EXPECT_EQ(escape_label_value(""), "");
  // Other control bytes and tabs are allowed as they are.
  EXPECT_EQ(escape_label_value("tab\there\r"), "tab\there\r");
}

TEST(MetricsEscaping, BytesThatAreNotUtf8BecomeReplacementCharacters) {
  const std::string replacement = "\xEF\xBF\xBD";
  EXPECT_EQ(escape_label_value("na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "na\xC3\xAFve \xE2\x82\xAC \xF0\x9F\x98\x80");
  EXPECT_EQ(escape_label_value("\xFF"), replacement);
  EXPECT_EQ(escape_label_value("end\xC3"), "end" + replacement);         // truncated
  EXPECT_EQ(escape_label_value("\xC0\xAF"), replacement + replacement);  // overlong '/'
  EXPECT_EQ(escape_label_value("\xED\xA0\x80"), replacement + replacement + replacement);
  EXPECT_EQ(escape_label_value("\xF4\x90\x80\x80"),  // past U+10FFFF
            replacement + replacement + replacement + replacement);
  EXPECT_EQ(escape_label_value("\x80\"x"), replacement + "\\\"x");
}

TEST(MetricsHistogram, BoundsAreEdgesOfTheHistogramsOwnBuckets) {
  const std::vector<uint64_t>& bounds = stall_bucket_bounds_us();
  ASSERT_FALSE(bounds.empty());
  EXPECT_EQ(bounds.front(), 1u);
  EXPECT_EQ(bounds.back(), uint64_t{1} << 26);
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (i > 0) {
      EXPECT_LT(bounds[i - 1], bounds[i]);
    }
    // Exact: everything just below the bound lies in an earlier bucket than the bound itself.
    EXPECT_LT(prefetch::StallHistogram::bucket_of(bounds[i] - 1),
              prefetch::StallHistogram::bucket_of(bounds[i]))
        << bounds[i];
  }
}

TEST(MetricsHistogram, CumulativeBucketsSumAndCount) {
  prefetch::StallHistogram stall;
  using std::chrono::nanoseconds;
  for (const int64_t ns : {int64_t{0}, int64_t{1000}, int64_t{1500}, int64_t{3'000'000},
                           int64_t{10'000'000'000}, int64_t{1'000'000'000'000}}) {
    stall.record(nanoseconds(ns));
  }
  std::string text;
  append_stall_histogram(text, "dsfs_test_stall_seconds", "A test", stall);
  const Exposition x = parse(text);
  EXPECT_EQ(x.types.at("dsfs_test_stall_seconds"), "histogram");

  const std::vector<const Sample*> buckets = find(x, "dsfs_test_stall_seconds_bucket");
  ASSERT_EQ(buckets.size(), stall_bucket_bounds_us().size() + 1);
  double last_le = -1;
  uint64_t last_count = 0;
  std::map<double, uint64_t> by_le;
  for (size_t i = 0; i < buckets.size(); ++i) {
    const std::string& le = buckets[i]->labels.at("le");
    const double bound = le == "+Inf" ? INFINITY : std::stod(le);
    if (i + 1 < buckets.size()) {
      EXPECT_NEAR(bound, static_cast<double>(stall_bucket_bounds_us()[i]) / 1e6, 1e-12);
    }
    EXPECT_GT(bound, last_le) << le;
    const uint64_t count = std::stoull(buckets[i]->value);
    EXPECT_GE(count, last_count) << "le=" << le;
    last_le = bound;
    last_count = count;
    by_le[bound] = count;
  }
  EXPECT_EQ(buckets.back()->labels.at("le"), "+Inf");
  EXPECT_EQ(by_le.at(1e-6), 1u);       // the cached read
  EXPECT_EQ(by_le.at(2e-6), 3u);       // and the two under 2 µs
  EXPECT_EQ(by_le.at(0.002048), 3u);   // 3 ms is above 2048 µs...
  EXPECT_EQ(by_le.at(0.003072), 4u);   // ...and below 3072 µs
  EXPECT_EQ(by_le.at(8.388608), 4u);   // 10 s
  EXPECT_EQ(by_le.at(12.582912), 5u);  //
  EXPECT_EQ(by_le.at(67.108864), 5u);  // 1000 s is past the last bound
  EXPECT_EQ(by_le.at(INFINITY), 6u);   //
  EXPECT_EQ(value_of(x, "dsfs_test_stall_seconds_count"), "6");
  EXPECT_NEAR(std::stod(*value_of(x, "dsfs_test_stall_seconds_sum")), 1010.0030025, 1e-9);
}

TEST(MetricsHistogram, EmptyHistogramHasZeroBucketsAndCount) {
  const prefetch::StallHistogram stall;
  std::string text;
  append_stall_histogram(text, "dsfs_x_seconds", "empty", stall);
  const Exposition x = parse(text);
  for (const Sample* s : find(x, "dsfs_x_seconds_bucket")) EXPECT_EQ(s->value, "0");
  EXPECT_EQ(value_of(x, "dsfs_x_seconds_count"), "0");
  EXPECT_EQ(value_of(x, "dsfs_x_seconds_sum"), "0");
}

std::shared_ptr<const catalog::Catalog> three_files() {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1024);
  builder.set_classes({"ant", "bee"});
  builder.add_file("bee/b.jpg", 10, 0, 0644, 2, 1, 0, "");
  builder.add_file("ant/a.jpg", 20, 0, 0644, 1, 0, 0, "");
  builder.add_file("loose.txt", 5, 0, 0644, 3, catalog::kNoLabel, 0, "");
  return std::make_shared<const catalog::Catalog>(std::move(builder).build());
}

// Sources with a few of everything, as Filesystem::render_snapshot hands them over.
class MetricsRender : public ::testing::Test {
 protected:
  MetricsRender() {
    fs.count(Op::kRead);
    fs.count(Op::kRead);
    fs.count(Op::kLookup);
    fs.count(ErrorKind::kNotFound);
    fs.files_read = 2;
    fs.bytes_read = 30;
    fetcher.round_trips = 4;
    fetcher.gets = 5;
    fetcher.bytes = 35;
    fetcher.unavailable = 1;
    reads.record(prefetch::ReadOutcome::kReady, std::chrono::nanoseconds(0));
    reads.record(prefetch::ReadOutcome::kMiss, std::chrono::milliseconds(2));
    cache.capacity_bytes = 1 << 20;
    cache.bytes = 35;
    engine.staging = 4;
    engine.passed_for_stagers = 9;
    views.cache.capacity_bytes = 1 << 19;
    odd.catalog = three_files();
    odd.info.name = "we\"ird\\name\nx";  // not a name ingest allows; the renderer must cope
    odd.info.generation = 7;
    plain.catalog = three_files();
    plain.info.name = "plain";
    plain.info.generation = 2;
    datasets = {&odd, &plain};
  }

  StatsSources sources() const {
    return StatsSources{.fs = fs,
                        .fetcher = fetcher,
                        .cache = cache,
                        .disk_tier = disk_tier,
                        .redis_connects = 3,
                        .views = views,
                        .reads = reads,
                        .prefetch = engine,
                        .plan_unresolved = 0,
                        .datasets = datasets,
                        .watch = watch,
                        .watch_options = watch_options,
                        .started = std::chrono::steady_clock::now(),
                        .redis_endpoint = "redis://:***@127.0.0.1:6379",
                        .ns = "dsfs",
                        .memory = {.trims = 2, .released_bytes = 4096},
                        .buffer_reuse = {.limit_bytes = 1 << 20,
                                         .held_bytes = 204'800,
                                         .reused = 7,
                                         .allocated = 3},
                        .resident_bytes = 8192};
  }

  FsCounters fs;
  prefetch::FetcherStats fetcher;
  prefetch::CacheStats cache;
  std::optional<prefetch::DiskTierStats> disk_tier;
  ViewStats views;
  prefetch::ReadStats reads;
  prefetch::EngineStats engine;
  prefetch::DatasetSnapshot odd;
  prefetch::DatasetSnapshot plain;
  std::vector<const prefetch::DatasetSnapshot*> datasets;
  WatchStats watch;
  WatchOptions watch_options;
};

TEST_F(MetricsRender, EveryFamilyFollowsTheConventions) {
  const std::string text = render_metrics(sources());
  const Exposition x = parse(text);
  ASSERT_FALSE(x.samples.empty());
  for (const auto& [name, type] : x.types) {
    EXPECT_TRUE(name.starts_with("dsfs_")) << name;
    EXPECT_EQ(name.ends_with("_total"), type == "counter") << name << " is a " << type;
    EXPECT_FALSE(name.ends_with("_ms") || name.ends_with("_us") || name.ends_with("_kib") ||
                 name.ends_with("_mib"))
        << name << ": base units";
  }
  for (const std::string& name : x.helped) EXPECT_TRUE(x.types.contains(name)) << name;
  // No family twice (the parser checks TYPE) and each sample under its own family's TYPE.
  std::set<std::string> seen(x.family_order.begin(), x.family_order.end());
  EXPECT_EQ(seen.size(), x.family_order.size());
  EXPECT_EQ(x.types.at("dsfs_read_stall_seconds"), "histogram");
}

TEST_F(MetricsRender, FiguresMatchTheSourcesAndStatsJson) {
  const Exposition x = parse(render_metrics(sources()));
  const nlohmann::json json = nlohmann::json::parse(render_stats_json(sources()));
  EXPECT_EQ(value_of(x, "dsfs_read_bytes_total"), "30");
  EXPECT_EQ(json["bytes_read"], 30);
  EXPECT_EQ(value_of(x, "dsfs_files_read_total"), "2");
  EXPECT_EQ(value_of(x, "dsfs_fuse_requests_total", {{"op", "read"}}), "2");
  EXPECT_EQ(value_of(x, "dsfs_fuse_requests_total", {{"op", "lookup"}}), "1");
  EXPECT_EQ(find(x, "dsfs_fuse_requests_total").size(), static_cast<size_t>(Op::kCount));
  EXPECT_EQ(value_of(x, "dsfs_fuse_errors_total", {{"kind", "not_found"}}), "1");
  EXPECT_EQ(value_of(x, "dsfs_redis_round_trips_total"),
            std::to_string(json["redis_ops"]["round_trips"].get<uint64_t>()));
  EXPECT_EQ(value_of(x, "dsfs_redis_gets_total"), "5");
  EXPECT_EQ(value_of(x, "dsfs_redis_received_bytes_total"), "35");
  EXPECT_EQ(value_of(x, "dsfs_redis_connects_total"), "3");
  EXPECT_EQ(value_of(x, "dsfs_redis_errors_total", {{"kind", "unavailable"}}), "1");
  EXPECT_EQ(value_of(x, "dsfs_cache_bytes"), "35");
  EXPECT_EQ(value_of(x, "dsfs_cache_capacity_bytes"), std::to_string(1 << 20));
  EXPECT_EQ(value_of(x, "dsfs_view_cache_capacity_bytes"), std::to_string(1 << 19));
  EXPECT_EQ(value_of(x, "dsfs_prefetch_reads_total", {{"outcome", "ready"}}), "1");
  EXPECT_EQ(value_of(x, "dsfs_prefetch_reads_total", {{"outcome", "joined"}}), "0");
  EXPECT_EQ(value_of(x, "dsfs_prefetch_reads_total", {{"outcome", "miss"}}), "1");
  EXPECT_EQ(json["prefetch"]["reads"]["miss"], 1);
  EXPECT_EQ(value_of(x, "dsfs_prefetch_disk_staging_objects"), "4");
  EXPECT_EQ(value_of(x, "dsfs_prefetch_disk_staging_passed_on_files"), "9");
  EXPECT_EQ(json["prefetch"]["disk_staging"]["passed_on"], 9);
  EXPECT_EQ(value_of(x, "dsfs_memory_resident_bytes"), "8192");
  EXPECT_EQ(json["memory"]["rss_bytes"], 8192);
  EXPECT_EQ(value_of(x, "dsfs_memory_trims_total"), "2");
  EXPECT_EQ(json["memory"]["trims"], 2);
  EXPECT_EQ(value_of(x, "dsfs_memory_released_bytes_total"), "4096");
  EXPECT_EQ(json["memory"]["released_bytes"], 4096);
  EXPECT_EQ(value_of(x, "dsfs_memory_reusable_bytes"), "204800");
  EXPECT_EQ(value_of(x, "dsfs_memory_buffers_reused_total"), "7");
  EXPECT_EQ(json["memory"]["buffer_reuse"]["limit_bytes"], 1 << 20);
  EXPECT_EQ(json["memory"]["buffer_reuse"]["held_bytes"], 204'800);
  EXPECT_EQ(json["memory"]["buffer_reuse"]["reused"], 7);
  EXPECT_EQ(json["memory"]["buffer_reuse"]["allocated"], 3);
  EXPECT_EQ(value_of(x, "dsfs_read_stall_seconds_count"), "2");
  EXPECT_EQ(value_of(x, "dsfs_read_stall_seconds_bucket", {{"le", "+Inf"}}), "2");
  EXPECT_NEAR(std::stod(*value_of(x, "dsfs_read_stall_seconds_sum")),
              json["prefetch"]["stall_us"]["total_s"].get<double>(), 1e-12);
  EXPECT_EQ(
      value_of(x, "dsfs_info", {{"namespace", "dsfs"}, {"redis", "redis://:***@127.0.0.1:6379"}}),
      "1");
}

TEST_F(MetricsRender, PerDatasetFiguresCarryTheNameEscaped) {
  const std::string text = render_metrics(sources());
  EXPECT_THAT(text, HasSubstr("dsfs_dataset_files{dataset=\"we\\\"ird\\\\name\\nx\"} 3\n"));
  const Exposition x = parse(text);
  EXPECT_EQ(value_of(x, "dsfs_dataset_generation", {{"dataset", "we\"ird\\name\nx"}}), "7");
  EXPECT_EQ(value_of(x, "dsfs_dataset_generation", {{"dataset", "plain"}}), "2");
  EXPECT_EQ(value_of(x, "dsfs_dataset_bytes", {{"dataset", "plain"}}), "35");
  EXPECT_EQ(find(x, "dsfs_dataset_files").size(), 2u);
}

TEST_F(MetricsRender, DiskTierOnlyWhenTheMountHasOne) {
  EXPECT_THAT(render_metrics(sources()), ::testing::Not(HasSubstr("dsfs_disk_cache")));
  disk_tier = prefetch::DiskTierStats{};
  disk_tier->capacity_bytes = 1 << 30;
  disk_tier->hits = 9;
  disk_tier->page_cache_reads = 2;
  disk_tier->direct_reads = 7;
  const Exposition x = parse(render_metrics(sources()));
  EXPECT_EQ(value_of(x, "dsfs_disk_cache_capacity_bytes"), std::to_string(1 << 30));
  EXPECT_EQ(value_of(x, "dsfs_disk_cache_hits_total"), "9");
  EXPECT_EQ(value_of(x, "dsfs_disk_cache_page_cache_reads_total"), "2");
  EXPECT_EQ(value_of(x, "dsfs_disk_cache_direct_reads_total"), "7");
}

// --- the endpoint ---

TEST(MetricsListenAddress, Forms) {
  ListenAddress a = parse_listen_address("9464");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 9464);
  a = parse_listen_address("0.0.0.0:80");
  EXPECT_EQ(a.host, "0.0.0.0");
  EXPECT_EQ(a.port, 80);
  a = parse_listen_address("[::1]:65535");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 65535);
  a = parse_listen_address("localhost:1");
  EXPECT_EQ(a.host, "localhost");
  for (const char* bad : {"", ":9464", "0", "65536", "port", "::1:9464", "[::1]", "[::1]9464",
                          "[]:9464", "host:", "127.0.0.1:94x", "-1"}) {
    try {
      parse_listen_address(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("--metrics-listen")) << bad;
      EXPECT_THAT(e.what(), HasSubstr("HOST:PORT")) << bad;
    }
  }
}

TEST(MetricsListener, APortInUseFailsNamingTheFlag) {
  const MetricsListener first(ListenAddress{.host = "127.0.0.1", .port = 0});
  ASSERT_NE(first.port(), 0);
  EXPECT_EQ(first.describe(), "127.0.0.1:" + std::to_string(first.port()));
  try {
    const MetricsListener second(ListenAddress{.host = "127.0.0.1", .port = first.port()});
    ADD_FAILURE() << "a second listener bound the same port";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics-listen 127.0.0.1:" + std::to_string(first.port())));
    EXPECT_THAT(e.what(), HasSubstr("already in use"));
  }
}

TEST(MetricsListener, AnAddressThisMachineLacksFails) {
  try {
    // TEST-NET-1 (RFC 5737): assigned to no machine.
    const MetricsListener listener(ListenAddress{.host = "192.0.2.1", .port = 9});
    ADD_FAILURE() << "bound 192.0.2.1";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--metrics-listen 192.0.2.1:9"));
    EXPECT_THAT(e.what(), HasSubstr("no such address"));
  }
}

// A connection to the server with a deadline on every read and write (the test fails rather
// than hangs when the server does not answer).
class Client {
 public:
  explicit Client(uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    EXPECT_GE(fd_, 0);
    timeval timeout{.tv_sec = 30, .tv_usec = 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  }
  ~Client() { ::close(fd_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send(const std::string& data) {
    EXPECT_EQ(::send(fd_, data.data(), data.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(data.size()));
  }
  // Everything the server sends until it closes. `reset_is_close`: a reset counts as the close
  // (a server that closes a connection with bytes it has not read yet sends RST, not FIN).
  std::string receive_all(bool reset_is_close = false) {
    std::string out;
    char buffer[4096];
    for (;;) {
      const ssize_t got = ::recv(fd_, buffer, sizeof buffer, 0);
      if (got < 0 && reset_is_close && errno == ECONNRESET) return out;
      EXPECT_GE(got, 0) << "no answer within 30 s: " << std::strerror(errno);
      if (got <= 0) return out;
      out.append(buffer, static_cast<size_t>(got));
    }
  }

 private:
  int fd_;
};

std::string http_exchange(uint16_t port, const std::string& request) {
  Client client(port);
  client.send(request);
  return client.receive_all();
}

class MetricsServerTest : public ::testing::Test {
 protected:
  static constexpr std::string_view kBody = "# HELP dsfs_up Up\n# TYPE dsfs_up gauge\ndsfs_up 1\n";

  void start(MetricsServerOptions options = {}) {
    server.emplace(
        MetricsListener(ListenAddress{.host = "127.0.0.1", .port = 0}),
        [this] {
          ++renders;
          return std::string(kBody);
        },
        options);
    port = server->listener().port();
  }

  // Connections waiting for the server to accept them (a listening socket's TCP_INFO).
  uint32_t accept_queue() const {
    tcp_info info{};
    socklen_t length = sizeof info;
    EXPECT_EQ(::getsockopt(server->listener().fd(), IPPROTO_TCP, TCP_INFO, &info, &length), 0);
    return info.tcpi_unacked;
  }

  std::atomic<int> renders{0};
  std::optional<MetricsServer> server;
  uint16_t port = 0;
};

TEST_F(MetricsServerTest, GetMetricsAnswersTheRenderedText) {
  start();
  const std::string response = http_exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(response.starts_with("HTTP/1.0 200 OK\r\n")) << response;
  EXPECT_THAT(response, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"));
  EXPECT_THAT(response, HasSubstr(fmt::format("Content-Length: {}\r\n", kBody.size())));
  EXPECT_TRUE(response.ends_with(fmt::format("\r\n\r\n{}", kBody))) << response;
  // A query string is ignored; bare newlines end lines too.
  EXPECT_THAT(http_exchange(port, "GET /metrics?x=1 HTTP/1.0\n\n"), HasSubstr("dsfs_up 1\n"));
  const std::string head = http_exchange(port, "HEAD /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(head.starts_with("HTTP/1.0 200 OK\r\n")) << head;
  EXPECT_TRUE(head.ends_with("\r\n\r\n")) << head;
  EXPECT_EQ(renders.load(), 3);
}

TEST_F(MetricsServerTest, OtherPathsMethodsAndMalformedRequests) {
  start();
  for (const char* path : {"/", "/metrics/", "/metricsx", "/stats.json", "metrics"}) {
    const std::string response = http_exchange(port, fmt::format("GET {} HTTP/1.0\r\n\r\n", path));
    EXPECT_TRUE(response.starts_with("HTTP/1.0 404 Not Found\r\n")) << path << ": " << response;
  }
  const std::string post = http_exchange(port, "POST /metrics HTTP/1.0\r\n\r\n");
  EXPECT_TRUE(post.starts_with("HTTP/1.0 405 ")) << post;
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD\r\n"));
  EXPECT_TRUE(http_exchange(port, "hello\r\n\r\n").starts_with("HTTP/1.0 400 ")) << "no version";
  EXPECT_EQ(renders.load(), 0);
}

TEST_F(MetricsServerTest, AnOversizedRequestIsRefused) {
  start(MetricsServerOptions{.max_request_bytes = 1024});
  const std::string response = http_exchange(
      port, "GET /metrics HTTP/1.0\r\nX-Long: " + std::string(8192, 'a') + "\r\n\r\n");
  EXPECT_TRUE(response.starts_with("HTTP/1.0 431 ")) << response.substr(0, 100);
  EXPECT_EQ(renders.load(), 0);
}

TEST_F(MetricsServerTest, AClientThatSendsNothingIsDroppedAtItsDeadline) {
  start(MetricsServerOptions{.connection_timeout = std::chrono::milliseconds(200)});
  Client silent(port);
  // The server gives up on it and closes: the client reads end-of-file, not an answer.
  EXPECT_EQ(silent.receive_all(), "");
  // And serves the next one.
  EXPECT_THAT(http_exchange(port, "GET /metrics HTTP/1.0\r\n\r\n"), HasSubstr("dsfs_up 1\n"));
}

TEST_F(MetricsServerTest, StoppingDoesNotWaitForAStuckClient) {
  // A deadline far beyond the test's own timeout: if the destructor waited for the client,
  // ctest would kill the test.
  start(MetricsServerOptions{.connection_timeout = std::chrono::hours(24)});
  Client stuck(port);
  stuck.send("GET /metr");
  // Wait (with a deadline) until the server has taken the connection: it now waits for the
  // rest of the request, which never comes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (accept_queue() != 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the server accepted nothing";
    std::this_thread::yield();
  }
  Client second(port);  // queued behind it
  // Stopping must not wait for either; a stop that hangs fails here rather than at ctest's
  // timeout.
  std::mutex mutex;
  std::condition_variable done;
  bool stopped = false;
  std::thread stopper([&] {
    server.reset();
    const std::lock_guard lock(mutex);
    stopped = true;
    done.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    if (!done.wait_for(lock, std::chrono::seconds(60), [&] { return stopped; })) {
      std::fprintf(stderr, "the metrics server did not stop within 60 s of a stuck client\n");
      std::abort();
    }
  }
  stopper.join();
  // Closed without an answer; with a reset when the server stopped before it read the partial
  // request (seen under TSan in CI: ECONNRESET).
  EXPECT_EQ(stuck.receive_all(/*reset_is_close=*/true), "");
}

}  // namespace
}  // namespace dsfs::fs
