// DatasetTable: indices given once, snapshots found by index without a lock while another
// thread appends (run under TSan too).
#include "prefetch/dataset_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "src/catalog/catalog.h"

namespace dsfs::prefetch {
namespace {

DatasetSnapshot snapshot(const std::string& name, uint64_t generation) {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1 << 20);
  builder.add_file("f", 1, 0, 0644, 1, catalog::kNoLabel, 0, "");
  DatasetSnapshot d;
  d.info.name = name;
  d.info.generation = generation;
  d.index = 999;  // overwritten
  d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
  return d;
}

TEST(DatasetTable, GivesEachSnapshotTheNextIndexForGood) {
  DatasetTable table({snapshot("a", 1), snapshot("b", 1)});
  EXPECT_EQ(table.size(), 2u);
  EXPECT_EQ(table.get(0)->name(), "a");
  EXPECT_EQ(table.get(1)->index, 1u);
  EXPECT_EQ(table.get(2), nullptr);
  const DatasetSnapshot* a = table.get(0);
  const DatasetSnapshot& again = table.append(snapshot("a", 2));
  EXPECT_EQ(again.index, 2u);
  EXPECT_EQ(table.get(2), &again);
  EXPECT_EQ(table.get(0), a);  // never moved
  EXPECT_EQ(table.get(0)->generation(), 1u);
  DatasetSnapshot empty = snapshot("c", 1);
  empty.catalog.reset();
  EXPECT_THROW(table.append(std::move(empty)), std::invalid_argument);
  EXPECT_EQ(table.size(), 3u);
}

TEST(DatasetTable, CrossesChunkBoundaries) {
  DatasetTable table;
  const auto base = snapshot("x", 1);
  for (uint32_t i = 0; i < 40'000; ++i) {
    DatasetSnapshot d = base;
    d.info.generation = i;
    ASSERT_EQ(table.append(std::move(d)).index, i);
  }
  for (uint32_t i = 0; i < 40'000; i += 997) EXPECT_EQ(table.get(i)->generation(), i);
  EXPECT_EQ(table.get(40'000), nullptr);
}

TEST(DatasetTable, ReadersSeeWholeSnapshotsWhileAnotherThreadAppends) {
  DatasetTable table({snapshot("first", 0)});
  constexpr uint32_t kAppends = 20'000;
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::atomic<uint64_t> checked{0};
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&] {
      while (!done.load()) {
        const uint32_t size = table.size();
        const DatasetSnapshot* last = table.get(size - 1);
        // Every index below size() is filled in, with the generation it was appended with.
        ASSERT_NE(last, nullptr);
        ASSERT_EQ(last->index, size - 1);
        ASSERT_EQ(last->generation(), size - 1);
        ASSERT_NE(last->catalog, nullptr);
        checked.fetch_add(1);
      }
    });
  }
  const auto base = snapshot("x", 0);
  for (uint32_t i = 1; i <= kAppends; ++i) {
    DatasetSnapshot d = base;
    d.info.generation = i;
    table.append(std::move(d));
  }
  done = true;
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(table.size(), kAppends + 1);
  EXPECT_GT(checked.load(), 0u);
}

}  // namespace
}  // namespace dsfs::prefetch
