// ObjectFetcher when Redis is reachable for some files and not others (found by the fault soak,
// tests/integration/test_soak_faults.py): a file whose fetch already waited the whole timeout
// is tried once more, not waited for again, even though other files' successes in between
// cleared the "Redis is down" state. A real redis-server that drops any client whose reply
// exceeds 256 KiB (client-output-buffer-limit) makes one file unfetchable and another fine.
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "prefetch/object_fetcher.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "src/store/pool.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::prefetch {
namespace {

using namespace std::chrono_literals;

constexpr const char* kName = "ff";
constexpr uint64_t kGeneration = 1;
constexpr uint64_t kBigBytes = 1 << 20;  // over the server's output limit: never arrives
constexpr uint64_t kSmallBytes = 1000;

class FetchFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4 << 20);
    builder.add_file("big1.bin", kBigBytes, 0, 0644, 1, catalog::kNoLabel, 0, "");
    builder.add_file("big2.bin", kBigBytes, 0, 0644, 2, catalog::kNoLabel, 0, "");
    builder.add_file("small.bin", kSmallBytes, 0, 0644, 3, catalog::kNoLabel, 0, "");
    dataset_.info.name = kName;
    dataset_.info.generation = kGeneration;
    dataset_.info.chunk_size = 4 << 20;
    dataset_.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
    const catalog::KeySchema keys("dsfs");
    store::Connection conn(redis_.endpoint());
    conn.command({"SET", keys.object(kName, kGeneration, 1), std::string(kBigBytes, 'a')})
        .expect_ok("SET");
    conn.command({"SET", keys.object(kName, kGeneration, 2), std::string(kBigBytes, 'b')})
        .expect_ok("SET");
    conn.command({"SET", keys.object(kName, kGeneration, 3), std::string(kSmallBytes, 'c')})
        .expect_ok("SET");
  }

  uint32_t entry(const char* name) const {
    return *dataset_.catalog->lookup(catalog::kRootIndex, name);
  }
  void fetch(const char* name) {
    const uint32_t chunk = 0;
    fetcher_.fetch_chunks(dataset_, entry(name), std::span<const uint32_t>(&chunk, 1));
  }
  uint64_t retries() const { return fetcher_.stats().retries.load(); }

  test::TestRedisServer redis_{
      test::TestRedisOptions{.extra_args = {"--client-output-buffer-limit", "normal 256kb 0 0"}}};
  store::Client client_{{redis_.endpoint()}, store::ClientOptions{.connections_per_node = 2}};
  ObjectFetcher fetcher_{client_, catalog::KeySchema("dsfs"), FetcherOptions{.timeout = 1s}};
  DatasetSnapshot dataset_;
};

TEST_F(FetchFailures, AFileThatJustWaitedTheWholeTimeoutIsTriedOnceNotWaitedForAgain) {
  // The first failure retries for the whole timeout.
  EXPECT_THROW(fetch("big1.bin"), store::ConnectionError);
  const uint64_t first_retries = retries();
  EXPECT_GT(first_retries, 0u);
  // Another file succeeds: Redis answers, so the fetcher no longer thinks it is down.
  fetch("small.bin");
  EXPECT_FALSE(fetcher_.redis_down());
  // The kernel re-issues the failed READ: one try, no retries (it used to wait a whole timeout
  // again, so one read(2) took several timeouts to fail).
  EXPECT_THROW(fetch("big1.bin"), store::ConnectionError);
  EXPECT_EQ(retries(), first_retries);
  // Another file that has not failed yet still gets the whole timeout.
  fetch("small.bin");
  EXPECT_THROW(fetch("big2.bin"), store::ConnectionError);
  EXPECT_GT(retries(), first_retries);
}

// A dataset removed under the mount (or Redis emptied) fails every read with a missing key: each
// logged its own error line, thousands a second (an audit's log grew 4.7 MB in minutes). A few
// lines per window are written now, the next one saying how many were held back.
TEST_F(FetchFailures, AnErrorEveryReadMeetsIsLoggedAFewTimesNotOncePerRead) {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", ring));
  store::Connection(redis_.endpoint()).command({"FLUSHALL"}).expect_ok("FLUSHALL");
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    try {
      fetch("small.bin");
    } catch (const IntegrityError&) {
      ++failed;
    }
  }
  spdlog::set_default_logger(previous);
  EXPECT_EQ(failed, 200);
  EXPECT_EQ(fetcher_.stats().missing.load(), 200u);
  const std::vector<std::string> lines = ring->last_formatted();
  EXPECT_GE(lines.size(), 1u);
  EXPECT_LE(lines.size(), 10u) << lines.size() << " lines for 200 reads";
  EXPECT_NE(lines.front().find("is missing from Redis"), std::string::npos) << lines.front();
}

}  // namespace
}  // namespace dsfs::prefetch
