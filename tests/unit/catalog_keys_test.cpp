#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "src/catalog/keys.h"
#include "src/store/cluster_slots.h"

using namespace dsfs::catalog;

TEST(KeySchema, DatasetLevelKeysShareTheNameHashTag) {
  const KeySchema keys;
  EXPECT_EQ(keys.ns(), "dsfs");
  EXPECT_EQ(keys.datasets(), "dsfs:datasets");
  EXPECT_EQ(keys.info("imagenet"), "dsfs:{imagenet}:info");
  EXPECT_EQ(keys.generations("imagenet"), "dsfs:{imagenet}:gens");
  EXPECT_EQ(keys.next_generation("imagenet"), "dsfs:{imagenet}:nextgen");
  EXPECT_EQ(keys.readers("imagenet"), "dsfs:{imagenet}:readers");
  EXPECT_EQ(keys.manifest_chunk("imagenet", 7, 0), "dsfs:{imagenet}:manifest:7:0");
  EXPECT_EQ(keys.manifest_chunk("imagenet", 7, 12), "dsfs:{imagenet}:manifest:7:12");
}

TEST(KeySchema, ObjectKeysHaveNoHashTag) {
  const KeySchema keys("team");
  EXPECT_EQ(keys.object("cifar", 3, 42), "team:cifar:3:o:42");
  EXPECT_EQ(keys.object_chunk("cifar", 3, 42, 5), "team:cifar:3:o:42:5");
  EXPECT_EQ(keys.object_piece("cifar", 3, 42, 0, /*chunked=*/false), keys.object("cifar", 3, 42));
  EXPECT_EQ(keys.object_piece("cifar", 3, 42, 5, /*chunked=*/true), "team:cifar:3:o:42:5");
  EXPECT_EQ(keys.object("cifar", 18446744073709551615ull, 0),
            "team:cifar:18446744073709551615:o:0");
  EXPECT_EQ(keys.object("cifar", 1, 1).find('{'), std::string::npos);
}

TEST(KeySchema, ScanPatterns) {
  const KeySchema keys;
  EXPECT_EQ(keys.generation_objects_pattern("ds", 4), "dsfs:ds:4:o:*");
  EXPECT_EQ(keys.dataset_objects_pattern("ds"), "dsfs:ds:*:o:*");
  EXPECT_EQ(keys.generation_manifest_pattern("ds", 4), "dsfs:{ds}:manifest:4:*");
  EXPECT_EQ(keys.dataset_manifests_pattern("ds"), "dsfs:{ds}:manifest:*");
}

// A tiny Redis-glob matcher for '*' only (the patterns hold no other glob character) so the test
// shows which keys a SCAN with these patterns would and would not visit.
static bool glob_match(std::string_view pattern, std::string_view key) {
  if (pattern.empty()) return key.empty();
  if (pattern[0] == '*') {
    for (size_t skip = 0; skip <= key.size(); ++skip) {
      if (glob_match(pattern.substr(1), key.substr(skip))) return true;
    }
    return false;
  }
  return !key.empty() && key[0] == pattern[0] && glob_match(pattern.substr(1), key.substr(1));
}

TEST(KeySchema, PatternsMatchOnlyTheirOwnObjects) {
  const KeySchema keys;
  const auto gen4 = keys.generation_objects_pattern("ds", 4);
  EXPECT_TRUE(glob_match(gen4, keys.object("ds", 4, 1)));
  EXPECT_TRUE(glob_match(gen4, keys.object_chunk("ds", 4, 1, 2)));
  EXPECT_FALSE(glob_match(gen4, keys.object("ds", 40, 1)));
  EXPECT_FALSE(glob_match(gen4, keys.object("ds", 5, 1)));
  EXPECT_FALSE(glob_match(gen4, keys.object("ds2", 4, 1)));
  EXPECT_FALSE(glob_match(gen4, keys.info("ds")));
  EXPECT_FALSE(glob_match(gen4, keys.manifest_chunk("ds", 4, 0)));

  const auto all = keys.dataset_objects_pattern("ds");
  EXPECT_TRUE(glob_match(all, keys.object("ds", 4, 1)));
  EXPECT_TRUE(glob_match(all, keys.object_chunk("ds", 9, 1, 3)));
  EXPECT_FALSE(glob_match(all, keys.object("ds2", 4, 1)));
  EXPECT_FALSE(glob_match(all, keys.object("d", 4, 1)));
  EXPECT_FALSE(glob_match(all, keys.info("ds")));
  EXPECT_FALSE(glob_match(all, keys.datasets()));
  EXPECT_FALSE(glob_match(all, KeySchema("other").object("ds", 4, 1)));

  const auto manifest4 = keys.generation_manifest_pattern("ds", 4);
  EXPECT_TRUE(glob_match(manifest4, keys.manifest_chunk("ds", 4, 0)));
  EXPECT_TRUE(glob_match(manifest4, keys.manifest_chunk("ds", 4, 11)));
  EXPECT_FALSE(glob_match(manifest4, keys.manifest_chunk("ds", 41, 0)));
  EXPECT_FALSE(glob_match(manifest4, keys.manifest_chunk("ds2", 4, 0)));
  EXPECT_FALSE(glob_match(manifest4, keys.object("ds", 4, 0)));
  const auto manifests = keys.dataset_manifests_pattern("ds");
  EXPECT_TRUE(glob_match(manifests, keys.manifest_chunk("ds", 9, 3)));
  EXPECT_FALSE(glob_match(manifests, keys.manifest_chunk("ds2", 9, 3)));
  EXPECT_FALSE(glob_match(manifests, keys.info("ds")));
}

TEST(KeySchema, RejectsInvalidNamespace) {
  EXPECT_THROW(KeySchema("a:b"), std::invalid_argument);
  EXPECT_THROW(KeySchema(""), std::invalid_argument);
  EXPECT_NO_THROW(KeySchema("ok-ns"));
}

// On a Redis Cluster: a dataset's metadata shares one slot (the publishing MULTI/EXEC touches one
// shard), its objects spread over the slots (and so over every shard).
TEST(KeySchema, MetadataSharesASlotAndObjectsSpread) {
  const KeySchema keys("dsfs");
  const uint32_t slot = dsfs::store::key_slot(keys.info("imagenet"));
  for (const std::string& key :
       {keys.generations("imagenet"), keys.next_generation("imagenet"), keys.readers("imagenet"),
        keys.manifest_chunk("imagenet", 7, 0), keys.manifest_chunk("imagenet", 8, 3)}) {
    EXPECT_EQ(dsfs::store::key_slot(key), slot) << key;
  }
  EXPECT_NE(dsfs::store::key_slot(keys.info("other")), slot);
  std::set<uint32_t> object_slots;
  for (uint64_t id = 1; id <= 1000; ++id) {
    object_slots.insert(dsfs::store::key_slot(keys.object("imagenet", 7, id)));
  }
  // 1000 keys hashed uniformly over 16384 slots land on about 970 distinct ones.
  EXPECT_GT(object_slots.size(), 900u);
}
