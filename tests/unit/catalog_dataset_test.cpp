// Dataset operations (publish, load, list, info, GC, rm) against a real redis-server.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/catalog/dataset.h"
#include "src/catalog/manifest.h"
#include "src/store/client.h"
#include "src/store/errors.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::catalog {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

class DatasetTest : public ::testing::Test {
 protected:
  // One server for the suite (no persistence needed); SetUp flushes it between tests.
  static void SetUpTestSuite() { server_ = std::make_unique<test::TestRedisServer>(); }
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    client_ = std::make_unique<store::Client>(std::vector{server_->endpoint()});
    client_->command({"FLUSHALL"}).expect_ok("FLUSHALL");
  }

  // Writes one object per file of `catalog` under generation `gen`, as ingest would.
  void write_objects(const std::string& name, uint64_t gen, const Catalog& catalog) {
    for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
      const CatalogEntry& e = catalog.entry(i);
      if (e.is_dir) continue;
      const std::string body(e.size, 'x');
      if (catalog.chunk_count(i) == 1) {
        client_->command({"SET", keys_.object(name, gen, e.object_id), body}).expect_ok("SET");
      } else {
        for (uint64_t k = 0; k < catalog.chunk_count(i); ++k) {
          client_->command({"SET", keys_.object_chunk(name, gen, e.object_id, k), "c"})
              .expect_ok("SET");
        }
      }
    }
  }

  // begin_generation + objects + publish; returns the published info.
  DatasetInfo ingest(const std::string& name, const Catalog& catalog) {
    DatasetInfo info;
    info.name = name;
    info.source = "/data/" + name;
    info.generation = begin_generation(*client_, keys_, name);
    write_objects(name, info.generation, catalog);
    publish(*client_, keys_, info, catalog);
    return info;
  }

  long long count_keys(const std::string& pattern) {
    return static_cast<long long>(client_->command({"KEYS", pattern}).size());
  }
  std::vector<std::string> all_keys(const std::string& pattern) {
    const store::Reply reply = client_->command({"KEYS", pattern});
    std::vector<std::string> out;
    for (size_t i = 0; i < reply.size(); ++i) {
      out.emplace_back(reply.element(i)->str, reply.element(i)->len);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static inline std::unique_ptr<test::TestRedisServer> server_;
  std::unique_ptr<store::Client> client_;
  KeySchema keys_{"dsfs"};
};

Catalog sample_catalog(int variant, uint64_t chunk_size = 1000) {
  CatalogBuilder b(ChecksumKind::kXxh64, chunk_size);
  b.set_classes({"cat", "dog"});
  b.add_file("cat/1.jpg", 100 + variant, 1, 0644, 1, 0, 11, "");
  b.add_file("dog/2.jpg", 2500, 2, 0644, 2, 1, 22, R"({"v":)" + std::to_string(variant) + "}");
  b.add_file("weird name ü.bin", 0, 3, 0644, 3, kNoLabel, 33, "");
  if (variant > 1) b.add_file("cat/extra.jpg", 7, 4, 0644, 4, 0, 44, "");
  return std::move(b).build();
}

TEST_F(DatasetTest, ListIsEmptyAndUnknownDatasetIsNotFound) {
  EXPECT_TRUE(list_datasets(*client_, keys_).empty());
  try {
    read_info(*client_, keys_, "nope");
    FAIL() << "expected DatasetNotFound";
  } catch (const DatasetNotFound& e) {
    EXPECT_THAT(e.what(), HasSubstr("'nope'"));
    EXPECT_THAT(e.what(), HasSubstr("namespace 'dsfs'"));
    EXPECT_THAT(e.what(), HasSubstr("dsfs list"));
  }
  // As its contract says (a caller validates what a user typed first): damaged, not a logic
  // error that no caller skipping damaged datasets catches.
  EXPECT_THROW(read_info(*client_, keys_, "bad name"), DatasetDamaged);
  EXPECT_THROW(remove_dataset(*client_, keys_, "nope"), DatasetNotFound);
  EXPECT_THROW(collect_garbage(*client_, keys_, "nope"), DatasetNotFound);
}

// A generation number is the server's time in microseconds at begin_generation, or one more
// than the last if that is later.
TEST_F(DatasetTest, GenerationsAreFreshAndRecorded) {
  const store::Reply time = client_->command({"TIME"});
  const uint64_t server_us =
      std::stoull(std::string(store::Reply::element_str(time.element(0)))) * 1000000;
  const uint64_t first = begin_generation(*client_, keys_, "ds");
  EXPECT_GE(first, server_us);
  const uint64_t second = begin_generation(*client_, keys_, "ds");
  EXPECT_GT(second, first);
  EXPECT_GE(begin_generation(*client_, keys_, "other"), first);
  client_->command({"SET", keys_.next_generation("ds"), "9999999999999999"}).expect_ok("SET");
  EXPECT_EQ(begin_generation(*client_, keys_, "ds"), 10000000000000000u);
  const store::Reply gens = client_->command({"SMEMBERS", keys_.generations("ds")});
  std::set<std::string> members;
  for (size_t i = 0; i < gens.size(); ++i)
    members.emplace(store::Reply::element_str(gens.element(i)));
  EXPECT_EQ(members, (std::set<std::string>{std::to_string(first), std::to_string(second),
                                            "10000000000000000"}));
  EXPECT_THROW(begin_generation(*client_, keys_, "a:b"), std::invalid_argument);
}

// Redis lost the counter with the data (FLUSHALL, a restart without persistence) and the dataset
// is made again: its generation is not one the lost dataset had. A counter started again at 1,
// and a mount holding the lost generation 1's chunks in its cache served files that mixed both
// datasets' bytes (found by an audit).
TEST_F(DatasetTest, ADatasetMadeAgainAfterRedisLostItsDataGetsANewGenerationNumber) {
  const DatasetInfo lost = ingest("ds", sample_catalog(1));
  client_->command({"FLUSHALL"}).expect_ok("FLUSHALL");
  const DatasetInfo again = ingest("ds", sample_catalog(2));
  EXPECT_GT(again.generation, lost.generation);
}

// The name joins the datasets set before anything is written, so a crash between the info flip
// and the end of publish cannot leave a published dataset out of `dsfs list` and mounts; until
// its info exists, list_datasets does not show it.
TEST_F(DatasetTest, NameIsRecordedAtBeginButListedOnlyOncePublished) {
  begin_generation(*client_, keys_, "ds");
  EXPECT_EQ(client_->command({"SISMEMBER", keys_.datasets(), "ds"}).integer(), 1);
  EXPECT_TRUE(list_datasets(*client_, keys_).empty());
  std::vector<std::string> unpublished;
  EXPECT_TRUE(list_datasets(*client_, keys_, &unpublished).empty());
  EXPECT_THAT(unpublished, ElementsAre("ds"));  // what dsfs list names on stderr
  ingest("ds", sample_catalog(1));
  unpublished.clear();
  EXPECT_THAT(list_datasets(*client_, keys_, &unpublished), ElementsAre("ds"));
  EXPECT_TRUE(unpublished.empty());
}

TEST_F(DatasetTest, PublishThenLoadRoundTrips) {
  const Catalog catalog = sample_catalog(1);
  const DatasetInfo published = ingest("ds", catalog);
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("ds"));

  const DatasetInfo info = read_info(*client_, keys_, "ds");
  EXPECT_EQ(info.name, "ds");
  EXPECT_EQ(info.schema_version, kSchemaVersion);
  EXPECT_EQ(info.generation, published.generation);
  EXPECT_EQ(info.previous_generation, 0u);
  EXPECT_EQ(info.file_count, 3u);
  EXPECT_EQ(info.dir_count, 3u);
  EXPECT_EQ(info.total_bytes, 101u + 2500);
  EXPECT_EQ(info.class_count, 2u);
  EXPECT_EQ(info.source, "/data/ds");
  EXPECT_EQ(info.chunk_size, 1000u);
  EXPECT_GT(info.created_unix, 1600000000);
  EXPECT_EQ(info.manifest_chunks, 1u);
  EXPECT_EQ(info.manifest_bytes, encode_manifest(catalog).size());
  EXPECT_EQ(info.manifest_xxh64, published.manifest_xxh64);

  const auto loaded = load_catalog(*client_, keys_, info);
  EXPECT_EQ(encode_manifest(*loaded), encode_manifest(catalog));
  EXPECT_EQ(loaded->metadata(*loaded->find("dog/2.jpg")), R"({"v":1})");
  // The client's connections are still in step after all that pipelining.
  EXPECT_EQ(client_->command({"PING"}).str(), "PONG");
}

TEST_F(DatasetTest, LargeManifestIsSplitIntoChunks) {
  CatalogBuilder b(ChecksumKind::kXxh64, kDefaultChunkSize);
  const std::string blob(kManifestChunkSize + 12345, 'm');
  b.add_file("big-meta", 5, 0, 0644, 1, kNoLabel, 0, R"({"blob":")" + blob + "\"}");
  b.add_file("small", 1, 0, 0644, 2, kNoLabel, 0, "");
  const Catalog catalog = std::move(b).build();
  ingest("big", catalog);
  const DatasetInfo info = read_info(*client_, keys_, "big");
  EXPECT_EQ(info.manifest_chunks, 2u);
  EXPECT_EQ(client_->command({"STRLEN", keys_.manifest_chunk("big", info.generation, 0)}).integer(),
            static_cast<long long>(kManifestChunkSize));
  const auto loaded = load_catalog(*client_, keys_, info);
  EXPECT_EQ(loaded->metadata(*loaded->find("big-meta")).size(), blob.size() + 11);
}

TEST_F(DatasetTest, LoadRejectsMissingShortLongAndCorruptManifests) {
  ingest("ds", sample_catalog(1));
  const DatasetInfo info = read_info(*client_, keys_, "ds");
  const std::string chunk = keys_.manifest_chunk("ds", info.generation, 0);
  const std::string original(client_->command({"GET", chunk}).str());

  client_->command({"SETRANGE", chunk, "40", "\x7f"});
  EXPECT_THAT([&] { load_catalog(*client_, keys_, info); },
              testing::ThrowsMessage<ManifestError>(HasSubstr("xxh64")));
  client_->command({"APPEND", chunk, "zz"});
  EXPECT_THAT([&] { load_catalog(*client_, keys_, info); },
              testing::ThrowsMessage<ManifestError>(HasSubstr("bytes")));
  client_->command({"SET", chunk, original.substr(0, original.size() - 1)});
  EXPECT_THAT([&] { load_catalog(*client_, keys_, info); },
              testing::ThrowsMessage<ManifestError>(HasSubstr("bytes")));
  client_->command({"DEL", chunk});
  EXPECT_THAT([&] { load_catalog(*client_, keys_, info); },
              testing::ThrowsMessage<ManifestError>(HasSubstr("missing")));
  DatasetInfo absurd = info;
  absurd.manifest_chunks = 1ull << 40;
  EXPECT_THROW(load_catalog(*client_, keys_, absurd), ManifestError);
  EXPECT_EQ(client_->command({"PING"}).str(), "PONG");
}

TEST_F(DatasetTest, ReadInfoRejectsCorruptAndNewerHashes) {
  ingest("ds", sample_catalog(1));
  const std::string key = keys_.info("ds");
  client_->command({"HSET", key, "schema_version", "2"});
  EXPECT_THAT([&] { read_info(*client_, keys_, "ds"); },
              testing::ThrowsMessage<std::runtime_error>(HasSubstr("upgrade dsfs")));
  client_->command({"HSET", key, "schema_version", "1"});
  client_->command({"HSET", key, "generation", "abc"});
  EXPECT_THAT([&] { read_info(*client_, keys_, "ds"); },
              testing::ThrowsMessage<std::runtime_error>(HasSubstr("'generation'")));
  client_->command({"HSET", key, "generation", "1"});
  client_->command({"HDEL", key, "manifest_xxh64"});
  EXPECT_THAT([&] { read_info(*client_, keys_, "ds"); },
              testing::ThrowsMessage<std::runtime_error>(HasSubstr("manifest_xxh64")));
  client_->command({"DEL", key});
  client_->command({"SET", key, "not a hash"});
  // Damage, not a Redis failure: listing and mounting all datasets skip it (issue 11).
  EXPECT_THROW(read_info(*client_, keys_, "ds"), DatasetDamaged);
}

TEST_F(DatasetTest, RepublishFlipsToTheNewGenerationAndRemembersThePrevious) {
  const DatasetInfo first = ingest("ds", sample_catalog(1));
  const DatasetInfo second = ingest("ds", sample_catalog(2));
  EXPECT_GT(second.generation, first.generation);
  const DatasetInfo info = read_info(*client_, keys_, "ds");
  EXPECT_EQ(info.generation, second.generation);
  EXPECT_EQ(info.previous_generation, first.generation);
  EXPECT_EQ(info.file_count, 4u);
  EXPECT_TRUE(load_catalog(*client_, keys_, info)->find("cat/extra.jpg"));
  // The old snapshot is still loadable until collected.
  DatasetInfo old = info;
  old.generation = first.generation;
  old.manifest_chunks = first.manifest_chunks;
  old.manifest_bytes = first.manifest_bytes;
  old.manifest_xxh64 = first.manifest_xxh64;
  old.file_count = first.file_count;
  old.total_bytes = first.total_bytes;
  EXPECT_FALSE(load_catalog(*client_, keys_, old)->find("cat/extra.jpg"));
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("ds"));
}

// What before_flip throws (an ingest stopped while its manifest was written) leaves the
// generation unpublished: the one published before stays current. Before, a SIGINT in that
// window was only looked at before the manifest, and the ingest published and exited 0.
TEST_F(DatasetTest, APublishStoppedBeforeTheFlipPublishesNothing) {
  const DatasetInfo first = ingest("ds", sample_catalog(1));
  DatasetInfo second;
  second.name = "ds";
  second.generation = begin_generation(*client_, keys_, "ds");
  const Catalog catalog = sample_catalog(2);
  write_objects("ds", second.generation, catalog);
  bool asked = false;
  EXPECT_THROW(publish(*client_, keys_, second, catalog,
                       [&] {
                         asked = true;
                         throw std::runtime_error("interrupted");
                       }),
               std::runtime_error);
  EXPECT_TRUE(asked);
  EXPECT_EQ(read_info(*client_, keys_, "ds").generation, first.generation);
}

// A Redis whose maxmemory-policy lets it evict any key is named, with whether it can evict now
// (a maxmemory is set); noeviction and volatile-* policies (dataset keys have no TTL) are not.
TEST_F(DatasetTest, ARedisThatEvictsAnyKeyIsNamed) {
  bool limited = true;
  EXPECT_EQ(eviction_risk(*client_, &limited), "");
  client_->command({"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}).expect_ok("CONFIG SET");
  EXPECT_THAT(eviction_risk(*client_, &limited), HasSubstr("maxmemory-policy allkeys-lru"));
  EXPECT_FALSE(limited);
  client_->command({"CONFIG", "SET", "maxmemory", "1000000000"}).expect_ok("CONFIG SET");
  EXPECT_THAT(eviction_risk(*client_, &limited), HasSubstr("maxmemory 1000000000"));
  EXPECT_TRUE(limited);
  client_->command({"CONFIG", "SET", "maxmemory-policy", "volatile-lru"}).expect_ok("CONFIG SET");
  EXPECT_EQ(eviction_risk(*client_), "");
  client_->command({"CONFIG", "SET", "maxmemory", "0"}).expect_ok("CONFIG SET");
  client_->command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}).expect_ok("CONFIG SET");
}

TEST_F(DatasetTest, PublishNeverGoesBackToAnOlderGeneration) {
  DatasetInfo slow;
  slow.name = "ds";
  slow.generation = begin_generation(*client_, keys_, "ds");
  const DatasetInfo fast = ingest("ds", sample_catalog(2));
  EXPECT_THAT([&] { publish(*client_, keys_, slow, sample_catalog(1)); },
              testing::ThrowsMessage<std::runtime_error>(HasSubstr("newer")));
  EXPECT_EQ(read_info(*client_, keys_, "ds").generation, fast.generation);
  DatasetInfo none;
  none.name = "ds";
  EXPECT_THROW(publish(*client_, keys_, none, sample_catalog(1)), std::invalid_argument);
}

// sample_catalog(1) with chunk size 1000 stores 5 object keys (101 B, 2500 B in 3 chunks, 0 B)
// and one manifest chunk.
constexpr long long kSampleObjectKeys = 5;

TEST_F(DatasetTest, GarbageCollectionKeepsCurrentAndPreviousPublished) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  const DatasetInfo g2 = ingest("ds", sample_catalog(1));
  const DatasetInfo g3 = ingest("ds", sample_catalog(1));
  ingest("ds2", sample_catalog(1));  // neighbours whose keys must survive
  ingest("d", sample_catalog(1));
  const long long neighbour_keys = count_keys("dsfs:ds2:*") + count_keys("dsfs:{ds2}:*") +
                                   count_keys("dsfs:d:*") + count_keys("dsfs:{d}:*");
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), kSampleObjectKeys);

  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1),
            static_cast<uint64_t>(kSampleObjectKeys + 1));
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_manifest_pattern("ds", g1.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g2.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g3.generation)), kSampleObjectKeys);
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1), 0u);  // nothing left to do

  // A failed ingest (objects, no manifest) between two published generations, and one still
  // running beyond the current one.
  const uint64_t failed = begin_generation(*client_, keys_, "ds");
  write_objects("ds", failed, sample_catalog(1));
  const DatasetInfo g5 = ingest("ds", sample_catalog(1));
  const uint64_t running = begin_generation(*client_, keys_, "ds");
  write_objects("ds", running, sample_catalog(1));

  // Kept: g5 (current) and g3 (the newest published before it); collected: g2 and the failure.
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1),
            static_cast<uint64_t>(kSampleObjectKeys + 1 + kSampleObjectKeys));
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g2.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", failed)), 0);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g3.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g5.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", running)), kSampleObjectKeys);
  EXPECT_EQ(client_->command({"SCARD", keys_.generations("ds")}).integer(), 3);

  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 0),
            static_cast<uint64_t>(kSampleObjectKeys + 1));
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g3.generation)), 0);
  EXPECT_TRUE(load_catalog(*client_, keys_, read_info(*client_, keys_, "ds")));
  EXPECT_EQ(count_keys("dsfs:ds2:*") + count_keys("dsfs:{ds2}:*") + count_keys("dsfs:d:*") +
                count_keys("dsfs:{d}:*"),
            neighbour_keys);
}

// An ingest killed after writing its manifest, before the flip, left a generation that looked
// published (its manifest:G:0 exists): the next collection kept it as "the previous one" and
// deleted the generation that really was current before (found by an audit).
TEST_F(DatasetTest, GarbageCollectionKeepsTheGenerationThatWasCurrentNotAnUnflippedOne) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  DatasetInfo killed;
  killed.name = "ds";
  killed.generation = begin_generation(*client_, keys_, "ds");
  write_objects("ds", killed.generation, sample_catalog(2));
  EXPECT_THROW(publish(*client_, keys_, killed, sample_catalog(2),
                       [] { throw std::runtime_error("killed"); }),
               std::runtime_error);
  ASSERT_EQ(count_keys(keys_.generation_manifest_pattern("ds", killed.generation)), 1);
  const DatasetInfo g3 = ingest("ds", sample_catalog(1));
  EXPECT_EQ(g3.previous_generation, g1.generation);

  collect_garbage(*client_, keys_, "ds", 1);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_manifest_pattern("ds", g1.generation)), 1);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", killed.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_manifest_pattern("ds", killed.generation)), 0);
  EXPECT_TRUE(load_catalog(*client_, keys_, g1));  // what a mount of the previous one reads
  EXPECT_EQ(
      client_->command({"SISMEMBER", keys_.published("ds"), std::to_string(killed.generation)})
          .integer(),
      0);
}

// A dataset published before the published set existed: the generation current until the
// first publish that records the set is taken as published, and older ones by their manifest.
TEST_F(DatasetTest, GarbageCollectionKeepsGenerationsPublishedBeforeThePublishedSet) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  const DatasetInfo g2 = ingest("ds", sample_catalog(1));
  client_->command({"DEL", keys_.published("ds")}).expect_ok("DEL");  // as an older dsfs left it
  const DatasetInfo g3 = ingest("ds", sample_catalog(1));
  collect_garbage(*client_, keys_, "ds", 2);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g2.generation)), kSampleObjectKeys);
  collect_garbage(*client_, keys_, "ds", 1);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g2.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g3.generation)), kSampleObjectKeys);
}

TEST_F(DatasetTest, PinnedGenerationSurvivesGarbageCollection) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  EXPECT_TRUE(pin_generation(*client_, keys_, "ds", "mount-a", g1.generation, 60s));
  EXPECT_FALSE(pin_generation(*client_, keys_, "ds", "mount-a", g1.generation, 60s));  // refresh
  const DatasetInfo g2 = ingest("ds", sample_catalog(2));
  const DatasetInfo g3 = ingest("ds", sample_catalog(1));
  EXPECT_EQ(pinned_generations(*client_, keys_, "ds"), std::set<uint64_t>{g1.generation});

  // g1 is two generations old, beyond keep_previous, but pinned; g2 is the kept previous one.
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1), 0u);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), kSampleObjectKeys);
  EXPECT_EQ(count_keys(keys_.generation_manifest_pattern("ds", g1.generation)), 1);
  // A pinned generation does not count as one of the kept previous ones.
  EXPECT_GT(collect_garbage(*client_, keys_, "ds", 0), 0u);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g2.generation)), 0);
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), kSampleObjectKeys);
  DatasetInfo old = read_info(*client_, keys_, "ds");
  old.generation = g1.generation;
  old.manifest_chunks = g1.manifest_chunks;
  old.manifest_bytes = g1.manifest_bytes;
  old.manifest_xxh64 = g1.manifest_xxh64;
  old.file_count = g1.file_count;
  old.total_bytes = g1.total_bytes;
  EXPECT_TRUE(load_catalog(*client_, keys_, old));  // the pinned snapshot still loads
  EXPECT_EQ(read_info(*client_, keys_, "ds").generation, g3.generation);
}

TEST_F(DatasetTest, ExpiredLeaseDoesNotPin) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  pin_generation(*client_, keys_, "ds", "crashed-mount", g1.generation, 50ms);
  ingest("ds", sample_catalog(2));
  ingest("ds", sample_catalog(1));
  std::this_thread::sleep_for(150ms);  // Redis's clock decides; it is the same host's here
  EXPECT_TRUE(pinned_generations(*client_, keys_, "ds").empty());
  EXPECT_EQ(client_->command({"EXISTS", keys_.readers("ds")}).integer(), 0);  // dropped

  pin_generation(*client_, keys_, "ds", "crashed-mount", g1.generation, 50ms);
  std::this_thread::sleep_for(150ms);
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1),
            static_cast<uint64_t>(kSampleObjectKeys + 1));
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), 0);
  EXPECT_EQ(client_->command({"ZCARD", keys_.readers("ds")}).integer(), 0);
  // Refreshing after the lease was dropped says so: the generation may be gone.
  EXPECT_TRUE(pin_generation(*client_, keys_, "ds", "crashed-mount", g1.generation, 60s));
}

TEST_F(DatasetTest, UnpinReleasesTheGeneration) {
  const DatasetInfo g1 = ingest("ds", sample_catalog(1));
  pin_generation(*client_, keys_, "ds", "mount-a", g1.generation, 60s);
  pin_generation(*client_, keys_, "ds", "mount-b", g1.generation, 60s);
  ingest("ds", sample_catalog(2));
  ingest("ds", sample_catalog(1));

  unpin_generation(*client_, keys_, "ds", "mount-a", g1.generation);
  unpin_generation(*client_, keys_, "ds", "mount-a", g1.generation);  // twice: no error
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1), 0u);           // mount-b still holds it
  unpin_generation(*client_, keys_, "ds", "mount-b", g1.generation);
  EXPECT_EQ(collect_garbage(*client_, keys_, "ds", 1),
            static_cast<uint64_t>(kSampleObjectKeys + 1));
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", g1.generation)), 0);
  EXPECT_EQ(client_->command({"EXISTS", keys_.readers("ds")}).integer(), 0);
}

TEST_F(DatasetTest, PinCurrentGenerationPinsWhatItReturns) {
  ingest("ds", sample_catalog(1));
  const DatasetInfo g2 = ingest("ds", sample_catalog(2));
  const std::string reader = make_reader_id();
  const DatasetInfo pinned = pin_current_generation(*client_, keys_, "ds", reader, 60s);
  EXPECT_EQ(pinned.generation, g2.generation);
  EXPECT_EQ(pinned.file_count, 4u);
  const store::Reply members = client_->command({"ZRANGE", keys_.readers("ds"), "0", "-1"});
  ASSERT_EQ(members.size(), 1u);
  EXPECT_EQ(store::Reply::element_str(members.element(0)),
            std::to_string(g2.generation) + ":" + reader);
  EXPECT_THROW(pin_current_generation(*client_, keys_, "nope", reader, 60s), DatasetNotFound);
  EXPECT_EQ(client_->command({"EXISTS", keys_.readers("nope")}).integer(), 0);
}

TEST_F(DatasetTest, LeaseArgumentsAndStrangeMembers) {
  const std::string a = make_reader_id();
  const std::string b = make_reader_id();
  EXPECT_NE(a, b);
  EXPECT_THAT(a, HasSubstr(":" + std::to_string(::getpid()) + ":"));
  EXPECT_THROW(pin_generation(*client_, keys_, "ds", "", 1, 60s), std::invalid_argument);
  EXPECT_THROW(pin_generation(*client_, keys_, "ds", "r", 1, 0s), std::invalid_argument);
  EXPECT_THROW(pin_generation(*client_, keys_, "a:b", "r", 1, 60s), std::invalid_argument);
  // Members that are not GEN:READER (written by hand) are ignored, not fatal.
  client_->command({"ZADD", keys_.readers("ds"), "+inf", "junk"});
  pin_generation(*client_, keys_, "ds", "r", 7, 60s);
  EXPECT_EQ(pinned_generations(*client_, keys_, "ds"), std::set<uint64_t>{7});
}

TEST_F(DatasetTest, RemoveDeletesEveryKeyOfTheDatasetOnly) {
  ingest("ds", sample_catalog(1));
  ingest("ds", sample_catalog(2));
  pin_generation(*client_, keys_, "ds", "mount-a", 1, 60s);  // rm removes leases too
  const uint64_t failed = begin_generation(*client_, keys_, "ds");
  write_objects("ds", failed, sample_catalog(1));
  ingest("ds2", sample_catalog(1));
  ingest("d", sample_catalog(1));
  const long long total_before = static_cast<long long>(count_keys("*"));
  const long long ds_keys = count_keys("dsfs:ds:*") + count_keys("dsfs:{ds}:*");

  std::vector<uint64_t> reported;
  const uint64_t deleted =
      remove_dataset(*client_, keys_, "ds", [&](uint64_t n) { reported.push_back(n); });
  // Every key but the generation counter.
  EXPECT_EQ(static_cast<long long>(deleted), ds_keys - 1);
  ASSERT_FALSE(reported.empty());
  EXPECT_EQ(reported.back(), deleted);
  EXPECT_TRUE(std::is_sorted(reported.begin(), reported.end()));
  EXPECT_EQ(count_keys("dsfs:ds:*"), 0);
  EXPECT_THAT(all_keys("dsfs:{ds}:*"), ElementsAre(keys_.next_generation("ds")));
  EXPECT_EQ(client_->command({"EXISTS", keys_.readers("ds")}).integer(), 0);
  EXPECT_EQ(count_keys("*"), total_before - ds_keys + 1);
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre("d", "ds2"));
  EXPECT_THROW(read_info(*client_, keys_, "ds"), DatasetNotFound);
  EXPECT_THROW(remove_dataset(*client_, keys_, "ds"), DatasetNotFound);
  EXPECT_TRUE(load_catalog(*client_, keys_, read_info(*client_, keys_, "ds2")));
}

TEST_F(DatasetTest, RemoveCleansUpAnIngestThatNeverPublished) {
  const uint64_t gen = begin_generation(*client_, keys_, "orphan");
  write_objects("orphan", gen, sample_catalog(1));
  EXPECT_EQ(remove_dataset(*client_, keys_, "orphan"),
            static_cast<uint64_t>(kSampleObjectKeys + 1));
  EXPECT_THAT(all_keys("*"), ElementsAre(keys_.next_generation("orphan")));
}

// A dataset removed and made again under its name goes on from the next generation number:
// with the number reused, a mount of the removed one and a disk cache (both name objects by
// dataset, generation and object id) served the new dataset's bytes under the old paths, or
// the old bytes under the new ones. Before, rm deleted the counter and the new one was 1 again.
TEST_F(DatasetTest, ADatasetMadeAgainAfterRemoveNeverReusesAGenerationNumber) {
  ingest("ds", sample_catalog(1));
  ingest("ds", sample_catalog(2));
  const uint64_t last = read_info(*client_, keys_, "ds").generation;
  remove_dataset(*client_, keys_, "ds");
  EXPECT_THROW(remove_dataset(*client_, keys_, "ds"), DatasetNotFound);  // the counter alone
  EXPECT_THAT(list_datasets(*client_, keys_), ElementsAre());
  ingest("ds", sample_catalog(3));
  EXPECT_GT(read_info(*client_, keys_, "ds").generation, last);
}

// An rm stopped part way (Ctrl-C, a lost connection) left a dataset whose objects were partly
// gone while list, info and mount showed it healthy (found by an audit: 81,241 of 100,000
// objects left, reads of the rest EIO). It is marked first and shown as being removed.
TEST_F(DatasetTest, ADatasetWhoseRemovalStoppedIsShownAsBeingRemoved) {
  ingest("ds", sample_catalog(1));
  ingest("other", sample_catalog(1));
  struct Stop {};
  EXPECT_THROW(remove_dataset(*client_, keys_, "ds", [](uint64_t) { throw Stop{}; }), Stop);
  EXPECT_THAT(
      [&] { read_info(*client_, keys_, "ds"); },
      testing::ThrowsMessage<DatasetDamaged>(testing::AllOf(
          HasSubstr("is being removed"), HasSubstr("UTC"), HasSubstr("run `dsfs rm ds` again"))));
  const std::vector<DatasetStatus> statuses = list_dataset_status(*client_, keys_);
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_THAT(statuses[0].damage, HasSubstr("is being removed"));
  EXPECT_TRUE(statuses[1].info);
  // An ingest under the name does not publish over the half-removed dataset.
  DatasetInfo again;
  again.name = "ds";
  again.generation = begin_generation(*client_, keys_, "ds");
  write_objects("ds", again.generation, sample_catalog(2));
  EXPECT_THAT([&] { publish(*client_, keys_, again, sample_catalog(2)); },
              testing::ThrowsMessage<std::runtime_error>(HasSubstr("dsfs rm ds")));
  EXPECT_GT(remove_dataset(*client_, keys_, "ds"), 0u);
  EXPECT_THAT(all_keys("dsfs:*ds*"), ElementsAre(keys_.next_generation("ds")));
  ingest("ds", sample_catalog(3));
  EXPECT_TRUE(load_catalog(*client_, keys_, read_info(*client_, keys_, "ds")));
}

TEST_F(DatasetTest, RemoveCanBeRerunAfterAnInterruption) {
  ingest("ds", sample_catalog(1));
  // As if an earlier rm stopped after deleting the objects and the datasets entry.
  client_->command({"EVAL",
                    "for _,k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end",
                    "0", keys_.dataset_objects_pattern("ds")});
  client_->command({"SREM", keys_.datasets(), "ds"});
  EXPECT_GT(remove_dataset(*client_, keys_, "ds"), 0u);
  EXPECT_THAT(all_keys("*"), ElementsAre(keys_.next_generation("ds")));
}

}  // namespace
}  // namespace dsfs::catalog
