// The catalogue against a real three-primary Redis Cluster, through the one store::Client every
// caller uses: an ingest spreads its objects over every node and publishes; the catalogue loads
// and every object reads back byte for byte; GC, leases and rm reach every node and leave no key
// behind.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
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
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;

class CatalogClusterTest : public ::testing::Test {
 protected:
  // One cluster for the suite (starting one takes a few seconds); SetUp empties it.
  static void SetUpTestSuite() { cluster_ = std::make_unique<test::TestCluster>(3); }
  static void TearDownTestSuite() { cluster_.reset(); }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr) << "the suite's cluster did not start (see SetUpTestSuite)";
    cluster_->flush_all();
    client_ = std::make_unique<store::Client>(cluster_->endpoints());
    ASSERT_TRUE(client_->is_cluster());
  }

  // A source tree of `files` files (three classes) of varied sizes, one of them over the
  // chunk size so it is stored in several pieces; `variant` changes every file's bytes.
  fs::path write_source(const std::string& dir, int files, unsigned variant) {
    const fs::path root = tmp_.path() / dir;
    for (int i = 0; i < files; ++i) {
      const size_t size = i == 0 ? 3 * kChunkSize + 17 : 100 + static_cast<size_t>(i) * 37;
      test::write_file(root / fmt::format("class{}", i % 3) / fmt::format("{}.bin", i),
                       test::pattern_bytes(size, variant * 1000 + static_cast<unsigned>(i)));
    }
    return root;
  }

  tools::IngestResult ingest(const fs::path& source, const std::string& name,
                             unsigned keep_generations = 1) {
    tools::IngestOptions options;
    options.source = source;
    options.dataset = name;
    options.jobs = 3;
    options.chunk_size = kChunkSize;
    options.keep_generations = keep_generations;
    options.progress = tools::ProgressStyle::kQuiet;
    return tools::run_ingest(*client_, keys_, options);
  }

  // Every file of the published `name` reads back (client.get_values, piece by piece) with the
  // bytes of source/path.
  void expect_reads_back(const std::string& name, const fs::path& source) {
    const DatasetInfo info = read_info(*client_, keys_, name);
    const auto catalog = load_catalog(*client_, keys_, info);
    size_t files = 0;
    for (uint32_t i = 0; i < catalog->entry_count(); ++i) {
      const CatalogEntry& entry = catalog->entry(i);
      if (entry.is_dir) continue;
      ++files;
      const uint64_t pieces = catalog->chunk_count(i);
      std::vector<std::string> piece_keys;
      for (uint64_t k = 0; k < pieces; ++k) {
        piece_keys.push_back(
            keys_.object_piece(name, info.generation, entry.object_id, k, pieces > 1));
      }
      const std::vector<store::ValueReply> values = client_->get_values(piece_keys, 8, 5s);
      std::string stored;
      for (size_t k = 0; k < values.size(); ++k) {
        ASSERT_EQ(values[k].kind, store::ValueReply::Kind::kValue)
            << catalog->path(i) << " piece " << k << " (" << piece_keys[k] << ")";
        stored.append(values[k].bytes.get(), values[k].size);
      }
      const std::string expected = test::read_file(source / catalog->path(i));
      EXPECT_EQ(stored.size(), expected.size()) << catalog->path(i);
      EXPECT_TRUE(stored == expected) << catalog->path(i) << " differs";
    }
    EXPECT_EQ(files, info.file_count);
  }

  // Keys matching `pattern` on each node (SCAN on that node).
  std::vector<uint64_t> keys_per_node(const std::string& pattern) const {
    std::vector<uint64_t> counts;
    for (size_t n = 0; n < cluster_->size(); ++n) {
      store::Connection conn(cluster_->node(n).endpoint());
      uint64_t count = 0;
      std::string cursor = "0";
      do {
        const store::Reply reply =
            conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
        reply.expect_ok("SCAN");
        cursor = std::string(store::Reply::element_str(reply.element(0)));
        count += reply.element(1)->elements;
      } while (cursor != "0");
      counts.push_back(count);
    }
    return counts;
  }

  static uint64_t sum(const std::vector<uint64_t>& counts) {
    uint64_t total = 0;
    for (const uint64_t count : counts) total += count;
    return total;
  }

  // DBSIZE of every node, summed.
  uint64_t keys_on_cluster() const {
    uint64_t total = 0;
    for (size_t n = 0; n < cluster_->size(); ++n) {
      total += static_cast<uint64_t>(cluster_->key_count(n));
    }
    return total;
  }

  static constexpr uint64_t kChunkSize = 4096;
  static inline std::unique_ptr<test::TestCluster> cluster_;
  std::unique_ptr<store::Client> client_;
  const KeySchema keys_{"dsfs"};
  test::TempDir tmp_{"dsfs-catalog-cluster"};
};

TEST_F(CatalogClusterTest, IngestSpreadsObjectsOverEveryPrimaryAndEveryObjectReadsBack) {
  const fs::path source = write_source("src", 60, 1);
  const tools::IngestResult result = ingest(source, "spread");
  EXPECT_EQ(result.files, 60u);
  EXPECT_EQ(result.classes, 3u);

  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("spread"));
  const std::vector<DatasetStatus> statuses = list_dataset_status(*client_, keys_);
  ASSERT_EQ(statuses.size(), 1u);
  ASSERT_TRUE(statuses[0].info) << statuses[0].damage;
  EXPECT_EQ(statuses[0].info->generation, result.generation);
  expect_reads_back("spread", source);

  // Object keys carry no hash tag: every primary holds some (59 plain objects and 4 chunks).
  const std::vector<uint64_t> objects = keys_per_node(keys_.dataset_objects_pattern("spread"));
  EXPECT_EQ(sum(objects), 63u);
  for (size_t n = 0; n < objects.size(); ++n) {
    EXPECT_GT(objects[n], 0u) << "node " << n << " holds no object";
    EXPECT_GT(cluster_->key_count(n), 0) << "node " << n << " is empty (DBSIZE)";
  }
}

TEST_F(CatalogClusterTest, GarbageCollectionAndLeasesReachEveryNode) {
  const fs::path first_source = write_source("v1", 30, 1);
  const tools::IngestResult first = ingest(first_source, "ds");
  const std::string reader = make_reader_id();
  // A mount serves the first generation: a re-ingest that keeps nothing must keep it anyway.
  EXPECT_EQ(pin_current_generation(*client_, keys_, "ds", reader, 60s).generation,
            first.generation);
  EXPECT_THAT(live_leases(*client_, keys_, "ds"),
              ElementsAre(fmt::format("{}:{}", first.generation, reader)));

  const fs::path second_source = write_source("v2", 30, 2);
  const tools::IngestResult second = ingest(second_source, "ds", 0);
  EXPECT_EQ(second.garbage_keys_deleted, 0u);
  EXPECT_EQ(sum(keys_per_node(keys_.generation_objects_pattern("ds", first.generation))), 33u);
  expect_reads_back("ds", second_source);

  // Unpinned, the next collection deletes the first generation's keys on every node, and
  // counts exactly what it deleted.
  unpin_generation(*client_, keys_, "ds", reader, first.generation);
  EXPECT_THAT(live_leases(*client_, keys_, "ds"), IsEmpty());
  const uint64_t before = keys_on_cluster();
  const uint64_t deleted = collect_garbage(*client_, keys_, "ds", 0);
  EXPECT_EQ(deleted, 33u + 1);  // objects and chunks, and the manifest's one chunk
  EXPECT_EQ(keys_on_cluster(), before - deleted);
  for (const uint64_t left :
       keys_per_node(keys_.generation_objects_pattern("ds", first.generation))) {
    EXPECT_EQ(left, 0u);
  }
  EXPECT_EQ(sum(keys_per_node(keys_.generation_objects_pattern("ds", second.generation))), 33u);
  expect_reads_back("ds", second_source);
}

TEST_F(CatalogClusterTest, ListInfoAndRemoveLeaveNoKeyOnAnyNode) {
  const fs::path source = write_source("src", 40, 3);
  const tools::IngestResult kept = ingest(source, "kept");
  const tools::IngestResult gone = ingest(source, "gone");
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("gone", "kept"));
  const DatasetInfo info = read_info(*client_, keys_, "gone");
  EXPECT_EQ(info.generation, gone.generation);
  EXPECT_EQ(info.file_count, 40u);
  EXPECT_EQ(info.source, fs::absolute(source).lexically_normal().string());

  const uint64_t before = keys_on_cluster();
  const uint64_t gone_keys =
      sum(keys_per_node("dsfs:gone:*")) + sum(keys_per_node("dsfs:{gone}:*"));
  uint64_t reported = 0;
  const uint64_t deleted =
      remove_dataset(*client_, keys_, "gone", [&](uint64_t so_far) { reported = so_far; });
  EXPECT_EQ(deleted, gone_keys - 1);  // all but the generation counter, which rm keeps
  EXPECT_EQ(reported, deleted);
  EXPECT_EQ(keys_on_cluster(), before - deleted);
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("kept"));
  EXPECT_THROW(read_info(*client_, keys_, "gone"), DatasetNotFound);
  EXPECT_THROW(remove_dataset(*client_, keys_, "gone"), DatasetNotFound);
  EXPECT_EQ(sum(keys_per_node("*gone*")), 1u);
  EXPECT_EQ(sum(keys_per_node(keys_.next_generation("gone"))), 1u);
  expect_reads_back("kept", source);
  EXPECT_EQ(read_info(*client_, keys_, "kept").generation, kept.generation);

  // The last dataset gone, so is the datasets set: nothing of dsfs is left on any node but the
  // two names' generation counters.
  remove_dataset(*client_, keys_, "kept");
  EXPECT_THAT(list_datasets(*client_, keys_), Not(Contains("kept")));
  EXPECT_EQ(keys_on_cluster(), 2u);
  EXPECT_EQ(sum(keys_per_node(keys_.next_generation("kept"))), 1u);
}

}  // namespace
}  // namespace dsfs::catalog
