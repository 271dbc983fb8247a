// Publishing while the dataset's slot is being moved to another primary (a reshard): the flip
// (WATCH, HGET, SISMEMBER, MULTI/HSET/EXEC on the {NAME} keys) meets TRYAGAIN while the slot's
// keys are split between the two nodes, then MOVED once the slot has moved. It must wait and
// run again where the slot lives, never fail the ingest (issue 12). A real two-primary cluster.
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <filesystem>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/catalog/dataset.h"
#include "src/store/client.h"
#include "src/store/connection.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_cluster.h"
#include "tools/ingest.h"

namespace dsfs::catalog {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string node_id(const test::TestRedisServer& node) {
  store::Connection conn(node.endpoint());
  return std::string(conn.command({"CLUSTER", "MYID"}).expect_ok("CLUSTER MYID").str());
}

// `rejected_calls` of WATCH on one node (INFO commandstats): WATCHes refused with a redirect or
// TRYAGAIN.
long long rejected_watches(const test::TestRedisServer& node) {
  store::Connection conn(node.endpoint());
  const std::string stats(conn.command({"INFO", "commandstats"}).expect_ok("INFO").str());
  const auto line = stats.find("cmdstat_watch:");
  if (line == std::string::npos) return 0;
  const auto field = stats.find("rejected_calls=", line);
  if (field == std::string::npos || field > stats.find('\n', line)) return 0;
  return std::stoll(stats.substr(field + 15));
}

// MIGRATE `keys` from `from` to `to` (one command, all keys in one slot).
void migrate(const test::TestRedisServer& from, const test::TestRedisServer& to,
             const std::vector<std::string>& keys) {
  store::Connection conn(from.endpoint());
  std::vector<std::string> argv = {
      "MIGRATE", to.endpoint().host, std::to_string(to.endpoint().port), "", "0", "5000", "KEYS"};
  argv.insert(argv.end(), keys.begin(), keys.end());
  std::vector<std::string_view> views(argv.begin(), argv.end());
  conn.command(std::span<const std::string_view>(views)).expect_ok("MIGRATE");
}

TEST(PublishOnAMovingSlot, WaitsForTheSlotAndPublishesWhereItNowLives) {
  test::TestCluster cluster(2);
  store::ClientOptions options;
  options.retry_budget = 30s;
  store::Client client(cluster.endpoints(), options);
  ASSERT_TRUE(client.is_cluster());
  const KeySchema keys{"dsfs"};
  test::TempDir tmp("dsfs-publish-moving");
  const std::string name = "moving";

  const auto ingest = [&](unsigned variant) {
    const fs::path source = tmp.path() / fmt::format("src{}", variant);
    for (int i = 0; i < 12; ++i) {
      test::write_file(source / fmt::format("class{}", i % 2) / fmt::format("{}.bin", i),
                       test::pattern_bytes(200 + static_cast<size_t>(i) * 31, variant * 100 + i));
    }
    tools::IngestOptions ingest_options;
    ingest_options.source = source;
    ingest_options.dataset = name;
    ingest_options.jobs = 2;
    ingest_options.progress = tools::ProgressStyle::kQuiet;
    return tools::run_ingest(client, keys, ingest_options);
  };
  const tools::IngestResult first = ingest(1);

  // The slot of {moving}: which node holds it now (the source) and which will (the target).
  const std::string info_key = keys.info(name);
  const std::string gens_key = keys.generations(name);
  store::Connection probe(cluster.node(0).endpoint());
  const std::string slot = std::to_string(
      probe.command({"CLUSTER", "KEYSLOT", info_key}).expect_ok("KEYSLOT").integer());
  const size_t source_index =
      store::Connection(cluster.node(0).endpoint()).command({"EXISTS", info_key}).is_error() ? 1
                                                                                             : 0;
  const test::TestRedisServer& source = cluster.node(source_index);
  const test::TestRedisServer& target = cluster.node(1 - source_index);
  const std::string source_id = node_id(source);
  const std::string target_id = node_id(target);

  // Half-way through a reshard: the slot is MIGRATING on the source, IMPORTING on the target,
  // and the info hash has already moved while gens has not. A WATCH of both gets TRYAGAIN.
  store::Connection(target.endpoint())
      .command({"CLUSTER", "SETSLOT", slot, "IMPORTING", source_id})
      .expect_ok("SETSLOT IMPORTING");
  store::Connection(source.endpoint())
      .command({"CLUSTER", "SETSLOT", slot, "MIGRATING", target_id})
      .expect_ok("SETSLOT MIGRATING");
  migrate(source, target, {info_key});
  const long long rejected_before = rejected_watches(source);

  // The second ingest runs while the reshard is stuck half-way; it must not fail.
  auto second = std::async(std::launch::async, [&] { return ingest(2); });

  // Once its flip has been refused (or the ingest is over, failed: the bug), finish the reshard:
  // move the rest of the slot's keys and give the slot to the target on both nodes.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (rejected_watches(source) == rejected_before &&
         second.wait_for(20ms) != std::future_status::ready) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the publish never tried its flip";
  }
  std::vector<std::string> rest;
  {
    store::Connection conn(source.endpoint());
    const store::Reply listed = conn.command({"CLUSTER", "GETKEYSINSLOT", slot, "1000"});
    listed.expect_ok("GETKEYSINSLOT");
    for (size_t i = 0; i < listed.size(); ++i) {
      rest.emplace_back(store::Reply::element_str(listed.element(i)));
    }
  }
  if (!rest.empty()) migrate(source, target, rest);
  for (const test::TestRedisServer* node : {&target, &source}) {
    store::Connection(node->endpoint())
        .command({"CLUSTER", "SETSLOT", slot, "NODE", target_id})
        .expect_ok("SETSLOT NODE");
  }

  tools::IngestResult published;
  ASSERT_NO_THROW(published = second.get()) << "the ingest failed while the slot moved";
  EXPECT_GT(rejected_watches(source), rejected_before) << "the flip never met the moving slot";
  EXPECT_GT(published.generation, first.generation);
  const DatasetInfo info = read_info(client, keys, name);
  EXPECT_EQ(info.generation, published.generation);
  EXPECT_EQ(info.previous_generation, first.generation);
  EXPECT_EQ(store::Connection(target.endpoint())
                .command({"HGET", info_key, "generation"})
                .expect_ok("HGET")
                .str(),
            std::to_string(published.generation))
      << "the info hash is not on the node that now owns its slot";
}

}  // namespace
}  // namespace dsfs::catalog
