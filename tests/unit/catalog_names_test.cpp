#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "src/catalog/names.h"

using namespace dsfs::catalog;
using namespace std::string_literals;

TEST(DatasetName, AcceptsTheDocumentedAlphabet) {
  EXPECT_TRUE(is_valid_dataset_name("imagenet"));
  EXPECT_TRUE(is_valid_dataset_name("ImageNet-1k_train.v2"));
  EXPECT_TRUE(is_valid_dataset_name("a"));
  EXPECT_TRUE(is_valid_dataset_name("..."));
  EXPECT_TRUE(is_valid_dataset_name(std::string(128, 'x')));
}

TEST(DatasetName, RejectsEverythingElse) {
  EXPECT_FALSE(is_valid_dataset_name(""));
  EXPECT_FALSE(is_valid_dataset_name("."));
  EXPECT_FALSE(is_valid_dataset_name(".."));
  EXPECT_FALSE(is_valid_dataset_name(std::string(129, 'x')));
  for (const char* bad : {"a b", "a/b", "a:b", "a{b}", "a*", "a?", "a[b]", "é", "a\\b"}) {
    EXPECT_FALSE(is_valid_dataset_name(bad)) << bad;
  }
  EXPECT_FALSE(is_valid_dataset_name("a\0b"s));
}

TEST(DatasetName, ValidateThrowsWithTheNameAndTheRule) {
  EXPECT_NO_THROW(validate_dataset_name("cifar10"));
  try {
    validate_dataset_name("x y");
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'x y'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1-128"), std::string::npos) << e.what();
  }
}

// A name beginning with '-' was accepted, and then `dsfs info -x` failed ("NAME is required"):
// every command line takes it for an option. Existing ones stay readable.
TEST(DatasetName, ANewNameMayNotBeginWithADash) {
  EXPECT_TRUE(is_valid_dataset_name("-x"));
  EXPECT_NO_THROW(validate_dataset_name("-x"));
  EXPECT_NO_THROW(validate_new_dataset_name("x-"));
  for (const char* name : {"-x", "--dash", "-"}) {
    try {
      validate_new_dataset_name(name);
      FAIL() << "expected invalid_argument for " << name;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("begins with '-'"), std::string::npos) << e.what();
    }
  }
}

TEST(PathComponent, AcceptsAnyBytesButSlashAndNul) {
  EXPECT_TRUE(is_valid_path_component("img 01.JPEG"));
  EXPECT_TRUE(is_valid_path_component("ünïcödé ✓"));
  EXPECT_TRUE(is_valid_path_component(".hidden"));
  EXPECT_TRUE(is_valid_path_component("..."));
  EXPECT_TRUE(is_valid_path_component("line\nbreak"));
  EXPECT_TRUE(is_valid_path_component(std::string(255, 'n')));
}

TEST(PathComponent, RejectsEmptyDotsSlashNulAndOverlong) {
  EXPECT_FALSE(is_valid_path_component(""));
  EXPECT_FALSE(is_valid_path_component("."));
  EXPECT_FALSE(is_valid_path_component(".."));
  EXPECT_FALSE(is_valid_path_component("a/b"));
  EXPECT_FALSE(is_valid_path_component("/"));
  EXPECT_FALSE(is_valid_path_component("a\0b"s));
  EXPECT_FALSE(is_valid_path_component(std::string(256, 'n')));
}

TEST(Namespace, ValidatesAlphabetAndLength) {
  EXPECT_NO_THROW(validate_namespace("dsfs"));
  EXPECT_NO_THROW(validate_namespace("team-a.prod_2"));
  EXPECT_NO_THROW(validate_namespace(std::string(64, 'n')));
  EXPECT_THROW(validate_namespace(""), std::invalid_argument);
  EXPECT_THROW(validate_namespace(std::string(65, 'n')), std::invalid_argument);
  EXPECT_THROW(validate_namespace("a:b"), std::invalid_argument);
  EXPECT_THROW(validate_namespace("a*"), std::invalid_argument);
  try {
    validate_namespace("bad ns");
    FAIL() << "expected invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'bad ns'"), std::string::npos) << e.what();
  }
}
