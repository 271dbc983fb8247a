// DatasetWatcher against a real redis-server: what stats.json is given to show (the announced
// listing) follows a switch only once the change listener, which tells the kernel to forget the
// old generation's names, has returned.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fs/dataset_watcher.h"
#include "fs/mount.h"
#include "fs/node.h"
#include "src/catalog/catalog.h"
#include "src/catalog/dataset.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::fs {
namespace {

using namespace std::chrono_literals;

constexpr char kDataset[] = "ds";
// A generation counter set ahead of the server's clock in microseconds: the next generation is
// kAhead + 1 whenever it is set, as a counter that restarts from 0 would give the same number.
constexpr char kAhead[] = "8999999999999999";

// Publishes a new generation of dataset `name` holding one file, f.bin = `content`; returns the
// generation.
uint64_t publish(store::Client& client, const std::string& content,
                 const std::string& name = kDataset) {
  const catalog::KeySchema keys("dsfs");
  const uint64_t generation = catalog::begin_generation(client, keys, name);
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 64 * 1024);
  builder.add_file("f.bin", content.size(), 0, 0644, 1, catalog::kNoLabel,
                   XXH64(content.data(), content.size(), 0), "");
  client.command({"SET", keys.object(name, generation, 1), content}).expect_ok("SET object");
  catalog::DatasetInfo info;
  info.name = name;
  info.generation = generation;
  info.source = "fs_watcher_test";
  catalog::publish(client, keys, info, std::move(builder).build());
  return generation;
}

void set_counter_ahead(store::Client& client) {
  client.command({"SET", catalog::KeySchema("dsfs").next_generation(kDataset), kAhead})
      .expect_ok("SET nextgen");
}

// The generation `listing` shows for `ds`; nullopt when it lists none.
std::optional<uint64_t> generation_in(const MountTree& tree, const MountTree::Listing& listing) {
  const auto found = listing.by_name.find(kDataset);
  if (found == listing.by_name.end()) return std::nullopt;
  return tree.dataset(found->second)->generation();
}

// A redis-server with generation kAhead + 1 of `ds` published, and a mount tree listing it.
class DatasetWatcherTest : public ::testing::Test {
 protected:
  test::TestRedisServer redis;
  store::Client client{std::vector{redis.endpoint()}};
  const uint64_t first = [this] {
    set_counter_ahead(client);
    return publish(client, "old bytes");
  }();
  MountTree tree{load_datasets(client, catalog::KeySchema("dsfs"), {kDataset})};
};

TEST_F(DatasetWatcherTest, ASwitchIsAnnouncedOnlyAfterTheListenerReturned) {
  std::atomic<DatasetWatcher*> watcher_seen{nullptr};
  std::optional<uint64_t> announced_during;
  std::optional<uint64_t> listed_during;
  int calls = 0;
  DatasetWatcher watcher(
      tree, client, catalog::KeySchema("dsfs"), WatchOptions{.names = {}, .interval = 0ms}, nullptr,
      [&](const std::vector<std::string>& names) {
        ++calls;
        EXPECT_EQ(names, std::vector<std::string>{kDataset});
        // Where the kernel would still hold the old names: stats must not show the new one yet.
        announced_during = generation_in(tree, *watcher_seen.load()->announced_listing());
        listed_during = generation_in(tree, *tree.listing());
      });
  watcher_seen = &watcher;
  EXPECT_EQ(generation_in(tree, *watcher.announced_listing()), first);

  const uint64_t second = publish(client, "new bytes");
  ASSERT_GT(second, first);
  ASSERT_EQ(watcher.refresh({kDataset}), 0);
  ASSERT_EQ(calls, 1);
  EXPECT_EQ(listed_during, second);  // the tree switched before the listener was told
  EXPECT_EQ(announced_during, first);
  EXPECT_EQ(generation_in(tree, *watcher.announced_listing()), second);
  EXPECT_EQ(watcher.stats().refreshed, 1u);
}

TEST_F(DatasetWatcherTest, APollThatFollowsUpdatesAnnouncesAfterTheListenerToo) {
  std::atomic<DatasetWatcher*> watcher_seen{nullptr};
  std::atomic<bool> told{false};
  std::optional<uint64_t> announced_during;
  DatasetWatcher watcher(tree, client, catalog::KeySchema("dsfs"),
                         WatchOptions{.names = {}, .interval = 20ms, .follow_updates = true},
                         nullptr, [&](const std::vector<std::string>&) {
                           // Held a while, as a kernel busy with the invalidation would: a
                           // reader polling the stats meanwhile must still see the old one.
                           std::this_thread::sleep_for(50ms);
                           announced_during =
                               generation_in(tree, *watcher_seen.load()->announced_listing());
                           told = true;
                         });
  watcher_seen = &watcher;
  watcher.start();
  const uint64_t second = publish(client, "new bytes");

  // Whatever moment the stats show the new generation, the listener has returned by then.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (generation_in(tree, *watcher.announced_listing()) != second) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the poll never switched";
    std::this_thread::yield();
  }
  EXPECT_TRUE(told.load());
  EXPECT_EQ(announced_during, first);
  watcher.stop();
}

// Redis lost its data and the dataset was made again under its number, other bytes of the
// same length under the same keys. A pass shows the new one, and the old snapshot fetches
// nothing more (its keys hold the new one's objects). Before, the pass saw generation 1 still
// current and kept it: files read the new objects under the old paths, mixed with cached ones.
TEST_F(DatasetWatcherTest, ADatasetMadeAgainUnderItsGenerationNumberIsShownAnewAndTheOldIsGone) {
  DatasetWatcher watcher(tree, client, catalog::KeySchema("dsfs"),
                         WatchOptions{.names = {}, .interval = 0ms}, nullptr,
                         [](const std::vector<std::string>&) {});
  const uint32_t old_index = *tree.find(kDataset);
  client.command({"FLUSHALL"}).expect_ok("FLUSHALL");
  // The counter went with the data. Generation numbers are the server's time in microseconds,
  // so the number comes back only from a counter set ahead of that (as the fixture's was), or
  // a server clock set back: what the watcher still guards against.
  set_counter_ahead(client);
  ASSERT_EQ(publish(client, "new bytes"), first);
  ASSERT_EQ(watcher.refresh({kDataset}), 0);
  const uint32_t new_index = *tree.find(kDataset);
  EXPECT_NE(new_index, old_index);
  EXPECT_TRUE(tree.dataset(old_index)->gone());
  EXPECT_FALSE(tree.dataset(new_index)->gone());
  EXPECT_EQ(watcher.stats().refreshed, 1u);
  // Removed: unlisted, and gone too.
  client.command({"FLUSHALL"}).expect_ok("FLUSHALL");
  ASSERT_EQ(watcher.refresh({}), 0);
  EXPECT_FALSE(tree.find(kDataset).has_value());
  EXPECT_TRUE(tree.dataset(new_index)->gone());
}

// The lease this mount holds survives a switch to a dataset made again under the same
// generation number. Before, the switch unpinned the old one's number, which was the new one's
// too: the generation it serves was unleased, and a collection after the next ingest would
// delete it under the mount.
TEST(DatasetWatcherLeases, ADatasetMadeAgainUnderItsGenerationNumberKeepsItsLease) {
  test::TestRedisServer redis;
  store::Client client(std::vector{redis.endpoint()});
  const catalog::KeySchema keys("dsfs");
  set_counter_ahead(client);
  const uint64_t first = publish(client, "old bytes");
  GenerationLeases leases(client, keys);
  MountTree tree(load_datasets(client, keys, {kDataset}, &leases));
  DatasetWatcher watcher(tree, client, keys, WatchOptions{.names = {}, .interval = 0ms}, &leases,
                         [](const std::vector<std::string>&) {});
  const std::string lease = std::to_string(first) + ":" + leases.reader_id();
  auto held = [&] { return client.command({"ZSCORE", keys.readers(kDataset), lease}).is_string(); };
  ASSERT_TRUE(held());

  client.command({"FLUSHALL"}).expect_ok("FLUSHALL");
  set_counter_ahead(client);
  ASSERT_EQ(publish(client, "new bytes"), first);
  ASSERT_EQ(watcher.refresh({kDataset}), 0);
  ASSERT_EQ(watcher.stats().refreshed, 1u);
  EXPECT_TRUE(held()) << "the generation the mount serves lost its lease";
}

TEST(DatasetWatcherFailingPass, WhatAPassChangedBeforeItFailedIsStillAnnounced) {
  test::TestRedisServer redis;
  store::Client client(std::vector{redis.endpoint()});
  const catalog::KeySchema keys("dsfs");
  publish(client, "a", "gone");
  publish(client, "b", "keep");
  MountTree tree(load_datasets(client, keys, {}));
  std::vector<std::string> told;
  DatasetWatcher watcher(tree, client, keys, WatchOptions{.names = {}, .interval = 0ms}, nullptr,
                         [&](const std::vector<std::string>& names) {
                           told.insert(told.end(), names.begin(), names.end());
                         });

  // 'gone' removed (a pass unlists it first), then a dataset 'later' whose info the mount may
  // not read: the pass fails on it with an error reply after it unlisted 'gone'.
  client.command({"SREM", keys.datasets(), "gone"}).expect_ok("SREM");
  client.command({"DEL", keys.info("gone")}).expect_ok("DEL");
  client.command({"SADD", keys.datasets(), "later"}).expect_ok("SADD");
  client.command({"HSET", keys.info("later"), "generation", "1"}).expect_ok("HSET");
  client
      .command({"ACL", "SETUSER", "default", "resetkeys", "~" + keys.datasets(), "~dsfs:{keep}*",
                "~dsfs:{gone}*", "%W~dsfs:{later}*"})
      .expect_ok("ACL SETUSER");

  EXPECT_EQ(watcher.refresh({}), EIO);
  ASSERT_EQ(tree.listing()->by_name.count("gone"), 0u) << "the pass did not unlist it first";
  // The kernel is told of the name the failed pass unlisted, and the stats stop showing it.
  EXPECT_EQ(told, std::vector<std::string>{"gone"});
  EXPECT_EQ(watcher.announced_listing()->by_name.count("gone"), 0u);
  EXPECT_EQ(watcher.announced_listing()->by_name.count("keep"), 1u);
  EXPECT_EQ(watcher.stats().removed, 1u);
}

}  // namespace
}  // namespace dsfs::fs
