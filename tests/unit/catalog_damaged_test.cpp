// One damaged dataset (issue 11, item 8) must not hide or break the others: read_info names the
// damage, the listing reports it beside the healthy ones, and rm still removes it. A real
// redis-server holds the datasets; the damage is written by hand, as a bad tool or operator would.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "src/catalog/dataset.h"
#include "src/catalog/manifest.h"
#include "src/catalog/names.h"
#include "src/store/client.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::catalog {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class DamagedDatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = std::make_unique<test::TestRedisServer>(); }
  static void TearDownTestSuite() { server_.reset(); }
  void SetUp() override {
    client_ = std::make_unique<store::Client>(std::vector{server_->endpoint()});
    client_->command({"FLUSHALL"}).expect_ok("FLUSHALL");
  }

  // Publishes a two-file dataset (objects written as ingest would) and returns its info.
  DatasetInfo publish_sample(const std::string& name) {
    CatalogBuilder builder(ChecksumKind::kXxh64, 1000);
    builder.set_classes({"cat"});
    builder.add_file("cat/1.jpg", 3, 1, 0644, 1, 0, 11, "");
    builder.add_file("cat/2.jpg", 4, 2, 0644, 2, 0, 22, "");
    const Catalog catalog = std::move(builder).build();
    DatasetInfo info;
    info.name = name;
    info.generation = begin_generation(*client_, keys_, name);
    for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
      const CatalogEntry& entry = catalog.entry(i);
      if (entry.is_dir) continue;
      client_
          ->command({"SET", keys_.object(name, info.generation, entry.object_id),
                     std::string(entry.size, 'x')})
          .expect_ok("SET");
    }
    publish(*client_, keys_, info, catalog);
    return info;
  }

  void command(std::initializer_list<std::string_view> argv) {
    client_->command(argv).expect_ok("damage");
  }

  // The listing's entry for `name`; fails the test if it is missing.
  DatasetStatus status_of(const std::vector<DatasetStatus>& statuses, const std::string& name) {
    for (const DatasetStatus& status : statuses) {
      if (status.name == name) return status;
    }
    ADD_FAILURE() << "dataset '" << name << "' is not listed";
    return {};
  }

  static inline std::unique_ptr<test::TestRedisServer> server_;
  std::unique_ptr<store::Client> client_;
  KeySchema keys_{"dsfs"};
};

TEST_F(DamagedDatasetTest, AnInfoKeyOfAnotherTypeIsNamedAsDamaged) {
  publish_sample("bad");
  command({"DEL", keys_.info("bad")});
  command({"SET", keys_.info("bad"), "not a hash"});
  try {
    read_info(*client_, keys_, "bad");
    FAIL() << "read_info accepted a string as the info hash";
  } catch (const DatasetDamaged& e) {
    EXPECT_THAT(e.what(), HasSubstr("dataset 'bad'"));
    EXPECT_THAT(e.what(), HasSubstr("not a hash"));
    EXPECT_THAT(e.what(), HasSubstr("dsfs rm bad"));
  }
}

TEST_F(DamagedDatasetTest, ACorruptFieldIsNamedAndItsBytesEscaped) {
  publish_sample("bad");
  command({"HSET", keys_.info("bad"), "file_count", "12\x1b[2Jx"});
  try {
    read_info(*client_, keys_, "bad");
    FAIL() << "read_info accepted a corrupt file_count";
  } catch (const DatasetDamaged& e) {
    EXPECT_THAT(e.what(), HasSubstr("field 'file_count' is '12\\x1b[2Jx', not a number"));
    EXPECT_THAT(e.what(), Not(HasSubstr("\x1b")));
  }
}

TEST_F(DamagedDatasetTest, TheListingReportsEachDamageBesideTheHealthyDatasets) {
  publish_sample("good");
  publish_sample("wrongtype");
  command({"DEL", keys_.info("wrongtype")});
  command({"RPUSH", keys_.info("wrongtype"), "x"});
  publish_sample("missing-field");
  command({"HDEL", keys_.info("missing-field"), "generation"});
  const DatasetInfo lost = publish_sample("no-manifest");
  command({"DEL", keys_.manifest_chunk("no-manifest", lost.generation, 0)});
  command({"SADD", keys_.datasets(), "bad name"});
  command({"HSET", keys_.info("bad name"), "generation", "1"});

  const std::vector<DatasetStatus> statuses = list_dataset_status(*client_, keys_);
  ASSERT_EQ(statuses.size(), 5u);
  const DatasetStatus good = status_of(statuses, "good");
  ASSERT_TRUE(good.info.has_value()) << good.damage;
  EXPECT_EQ(good.info->file_count, 2u);
  EXPECT_TRUE(good.damage.empty());
  const struct {
    std::string name;
    std::string reason;
  } expected[] = {
      {"wrongtype", "is not a hash"},
      {"missing-field", "field 'generation' is missing"},
      {"no-manifest", "manifest of its generation"},
      {"bad name", "not a valid dataset name"},
  };
  for (const auto& [name, reason] : expected) {
    const DatasetStatus status = status_of(statuses, name);
    EXPECT_FALSE(status.info.has_value()) << name;
    EXPECT_THAT(status.damage, HasSubstr(reason)) << name;
  }
}

// A name that came from the set and is no valid name is damage like any other (a mount of every
// dataset skips it): read_info threw std::invalid_argument, which no caller skipping damaged
// datasets caught.
TEST_F(DamagedDatasetTest, AnInvalidNameFromTheSetIsDamaged) {
  publish_sample("good");
  command({"SADD", keys_.datasets(), "*"});
  command({"HSET", keys_.info("*"), "generation", "1"});
  EXPECT_THROW(read_info(*client_, keys_, "*"), DatasetDamaged);
}

TEST_F(DamagedDatasetTest, RemoveDeletesADamagedDatasetAndEveryKeyOfIt) {
  publish_sample("good");
  publish_sample("bad");
  command({"DEL", keys_.info("bad")});
  command({"SET", keys_.info("bad"), "garbage"});
  command({"DEL", keys_.readers("bad")});
  command({"SET", keys_.readers("bad"), "garbage"});
  EXPECT_GT(remove_dataset(*client_, keys_, "bad"), 0u);
  // Every key but the generation counter, which rm keeps (a dataset made again goes on from it).
  const store::Reply left = client_->command({"KEYS", "*bad*"});
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(std::string_view(left.element(0)->str, left.element(0)->len),
            keys_.next_generation("bad"));
  const std::vector<DatasetStatus> statuses = list_dataset_status(*client_, keys_);
  ASSERT_EQ(statuses.size(), 1u);
  EXPECT_EQ(statuses[0].name, "good");
  EXPECT_TRUE(statuses[0].info.has_value());
}

TEST(DatasetNames, ReservedNamesAreRefusedForNewDatasetsOnly) {
  for (const char* name : {".dsfs", ".meta", ".views", ".hidden"}) {
    EXPECT_TRUE(is_reserved_dataset_name(name)) << name;
    EXPECT_NO_THROW(validate_dataset_name(name)) << name;  // an old one can still be removed
    try {
      validate_new_dataset_name(name);
      ADD_FAILURE() << name << " was accepted for a new dataset";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), HasSubstr("is reserved")) << name;
    }
  }
  EXPECT_NO_THROW(validate_new_dataset_name("imagenet.train"));
  EXPECT_THROW(validate_new_dataset_name("a/b"), std::invalid_argument);
}

TEST_F(DamagedDatasetTest, BeginGenerationRefusesAReservedName) {
  EXPECT_THROW(begin_generation(*client_, keys_, ".views"), std::invalid_argument);
  EXPECT_EQ(client_->command({"KEYS", "*"}).size(), 0u);
}

}  // namespace
}  // namespace dsfs::catalog
