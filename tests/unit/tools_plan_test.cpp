// `dsfs plan`: how input lines become plan paths, how the plan is written, and the mount checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/support/files.h"
#include "tools/plan_command.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The message of the PlanInputError that `body` throws ("" when it throws none).
template <typename Body>
std::string input_error(Body body) {
  try {
    body();
  } catch (const PlanInputError& e) {
    return e.what();
  }
  return "";
}

class PlanNormalizerTest : public ::testing::Test {
 protected:
  PlanPathNormalizer normalizer_{{"/mnt/dsfs", "/data/real-mount/"}};

  std::optional<std::string> normalize(std::string_view line, uint64_t line_number = 1) {
    return normalizer_.normalize(line, line_number);
  }
};

TEST_F(PlanNormalizerTest, KeepsRelativePathsAndDropsCarriageReturns) {
  EXPECT_EQ(normalize("imagenet/train/n01440764/img_0001.JPEG"),
            "imagenet/train/n01440764/img_0001.JPEG");
  EXPECT_EQ(normalize("tv/class_0000/img_000001.JPEG\r"), "tv/class_0000/img_000001.JPEG");
  EXPECT_EQ(normalize("file with spaces .jpg"), "file with spaces .jpg");
  EXPECT_EQ(normalize("a"), "a");
}

TEST_F(PlanNormalizerTest, SkipsEmptyLines) {
  EXPECT_EQ(normalize(""), std::nullopt);
  EXPECT_EQ(normalize("\r"), std::nullopt);
}

TEST_F(PlanNormalizerTest, NormalizesDotsAndDoubleSlashes) {
  EXPECT_EQ(normalize("./tv/a.jpg"), "tv/a.jpg");
  EXPECT_EQ(normalize("tv//a.jpg"), "tv/a.jpg");
  EXPECT_EQ(normalize("tv/./x/../a.jpg"), "tv/a.jpg");
}

TEST_F(PlanNormalizerTest, TurnsAbsolutePathsUnderEitherSpellingOfTheMountIntoRelativeOnes) {
  EXPECT_EQ(normalize("/mnt/dsfs/tv/class_0000/img.JPEG"), "tv/class_0000/img.JPEG");
  EXPECT_EQ(normalize("/mnt/dsfs//tv/../tv/img.JPEG\r"), "tv/img.JPEG");
  EXPECT_EQ(normalize("/data/real-mount/tv/img.JPEG"), "tv/img.JPEG");
}

TEST_F(PlanNormalizerTest, RejectsAbsolutePathsOutsideTheMountNamingTheLine) {
  const std::string outside = input_error([&] { normalize("/etc/passwd", 17); });
  EXPECT_THAT(outside, HasSubstr("line 17"));
  EXPECT_THAT(outside, HasSubstr("/etc/passwd"));
  EXPECT_THAT(outside, HasSubstr("not under the mount /mnt/dsfs"));
  // A sibling whose name merely starts like the mount's is outside too.
  EXPECT_THAT(input_error([&] { normalize("/mnt/dsfs2/tv/a.jpg", 3); }), HasSubstr("line 3"));
  EXPECT_THAT(input_error([&] { normalize("/mnt/dsfs/../x/a.jpg", 4); }), HasSubstr("line 4"));
}

TEST_F(PlanNormalizerTest, RejectsTheMountItselfAndPathsClimbingOut) {
  EXPECT_THAT(input_error([&] { normalize("/mnt/dsfs", 2); }), HasSubstr("the mount itself"));
  EXPECT_THAT(input_error([&] { normalize("/mnt/dsfs/", 2); }), HasSubstr("the mount itself"));
  EXPECT_THAT(input_error([&] { normalize(".", 2); }), HasSubstr("the mount itself"));
  EXPECT_THAT(input_error([&] { normalize("../secret", 5); }), HasSubstr("line 5"));
  EXPECT_THAT(input_error([&] { normalize("tv/../../secret", 6); }), HasSubstr("climbs out"));
}

TEST_F(PlanNormalizerTest, RejectsNulBytes) {
  EXPECT_THAT(input_error([&] { normalize(std::string_view("tv/a\0b", 6), 9); }),
              HasSubstr("line 9: contains a NUL byte"));
}

TEST(PlanInputTest, ReadsEveryNonEmptyLineInOrderAndCountsLinesForErrors) {
  const PlanPathNormalizer normalizer({"/m"});
  std::istringstream input("tv/b.jpg\r\n\n/m/tv/a.jpg\n./tv/c.jpg");  // no final newline
  const PlanText plan = read_plan_input(input, normalizer, "paths.txt");
  EXPECT_EQ(plan.paths, 3u);
  EXPECT_EQ(plan.text, "tv/b.jpg\ntv/a.jpg\ntv/c.jpg\n");

  std::istringstream bad("tv/a.jpg\n\n\n/elsewhere/b.jpg\n");
  const std::string message = input_error([&] { read_plan_input(bad, normalizer, "paths.txt"); });
  EXPECT_THAT(message, HasSubstr("line 4"));

  std::istringstream empty("\n\r\n");
  EXPECT_EQ(read_plan_input(empty, normalizer, "x").paths, 0u);
}

// Each write(2) on a SOCK_SEQPACKET socket arrives as one message, so the test sees exactly
// where the writer cut the plan.
std::vector<std::string> written_messages(std::string_view text, size_t chunk) {
  std::array<int, 2> fds{};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, fds.data()), 0);
  write_plan_text(fds[0], text, chunk);
  ::close(fds[0]);
  std::vector<std::string> messages;
  std::string buffer(1 << 16, '\0');
  for (;;) {
    const ssize_t n = ::recv(fds[1], buffer.data(), buffer.size(), 0);
    if (n <= 0) break;
    messages.emplace_back(buffer.data(), static_cast<size_t>(n));
  }
  ::close(fds[1]);
  return messages;
}

TEST(PlanWriteTest, WritesWholeLinesInChunksOfAtMostTheChunkSize) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += "tv/class_" + std::to_string(i % 7) + "/img.jpg\n";
  const std::vector<std::string> messages = written_messages(text, 64);
  ASSERT_GT(messages.size(), 1u);
  std::string joined;
  for (const std::string& message : messages) {
    EXPECT_LE(message.size(), 64u);
    EXPECT_EQ(message.back(), '\n') << "a write cut a path in two: " << message;
    joined += message;
  }
  EXPECT_EQ(joined, text);
}

TEST(PlanWriteTest, ALineLongerThanTheChunkGoesInOneWrite) {
  const std::string long_line = std::string(100, 'x') + "\n";
  const std::string text = "a\n" + long_line + "b\n";
  const std::vector<std::string> messages = written_messages(text, 16);
  EXPECT_EQ(messages, (std::vector<std::string>{"a\n", long_line, "b\n"}));
}

TEST(PlanWriteTest, WritesNothingForAnEmptyPlan) {
  EXPECT_TRUE(written_messages("", 16).empty());
}

// A directory laid out as a mount's .dsfs: stats.json and a plan file.
class FakeMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_file(mount_ / ".dsfs" / "stats.json", "{}");
    test::write_file(mount_ / ".dsfs" / "plan", "");
    fs::create_directories(mount_ / "tv" / "class_0000");
  }

  test::TempDir dir_;
  fs::path mount_ = dir_.path() / "mnt";
};

TEST_F(FakeMountTest, ReplacesThenAppends) {
  write_plan_file(mount_, "tv/a.jpg\ntv/b.jpg\n", /*append=*/false);
  EXPECT_EQ(test::read_file(mount_ / ".dsfs" / "plan"), "tv/a.jpg\ntv/b.jpg\n");
  write_plan_file(mount_, "tv/c.jpg\n", /*append=*/true);
  EXPECT_EQ(test::read_file(mount_ / ".dsfs" / "plan"), "tv/a.jpg\ntv/b.jpg\ntv/c.jpg\n");
  write_plan_file(mount_, "tv/d.jpg\n", /*append=*/false);
  EXPECT_EQ(test::read_file(mount_ / ".dsfs" / "plan"), "tv/d.jpg\n");
  write_plan_file(mount_, "", /*append=*/false);
  EXPECT_EQ(test::read_file(mount_ / ".dsfs" / "plan"), "");
}

TEST_F(FakeMountTest, AMountWithoutAPlanFileSaysItPredatesTheEngine) {
  fs::remove(mount_ / ".dsfs" / "plan");
  try {
    write_plan_file(mount_, "tv/a.jpg\n", false);
    FAIL() << "no error without a plan file";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr((mount_ / ".dsfs" / "plan").string()));
    EXPECT_THAT(e.what(), HasSubstr("predates the prefetch engine"));
  }
}

TEST_F(FakeMountTest, ChecksThatADirectoryIsAMount) {
  EXPECT_EQ(input_error([&] { check_dsfs_mount(mount_); }), "");
  EXPECT_EQ(input_error([&] { check_dsfs_mount(mount_.string() + "/"); }), "");

  const std::string plain = input_error([&] { check_dsfs_mount(dir_.path()); });
  EXPECT_THAT(plain, HasSubstr(dir_.path().string() + " is not a dsfs mount"));
  EXPECT_THAT(plain, HasSubstr(".dsfs/stats.json"));

  const std::string inside = input_error([&] { check_dsfs_mount(mount_ / "tv" / "class_0000"); });
  EXPECT_THAT(inside, HasSubstr("inside the dsfs mount " + mount_.string()));

  EXPECT_THAT(input_error([&] { check_dsfs_mount(dir_.path() / "missing"); }),
              HasSubstr("is not a directory"));
  test::write_file(dir_.path() / "file", "x");
  EXPECT_THAT(input_error([&] { check_dsfs_mount(dir_.path() / "file"); }),
              HasSubstr("is not a directory"));
}

TEST_F(FakeMountTest, AcceptsAbsolutePathsThroughASymlinkedSpellingOfTheMount) {
  const fs::path link = dir_.path() / "link";
  fs::create_directory_symlink(mount_, link);
  const std::vector<fs::path> spellings = mount_root_spellings(link);
  ASSERT_EQ(spellings.size(), 2u);
  const PlanPathNormalizer normalizer(spellings);
  EXPECT_EQ(normalizer.normalize((link / "tv/a.jpg").string(), 1), "tv/a.jpg");
  EXPECT_EQ(normalizer.normalize((fs::canonical(mount_) / "tv/b.jpg").string(), 2), "tv/b.jpg");
}

}  // namespace
}  // namespace dsfs::tools
