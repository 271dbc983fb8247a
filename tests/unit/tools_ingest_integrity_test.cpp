// The ingest side's integrity: ImageFolder parity with torchvision (class order of names that
// are not UTF-8, symlinked class directories), pax archives with UTF-8 names in the C locale,
// URL-list path collisions found before downloading, what an ingest publishes when the dataset
// is removed, Redis restarts, or another ingest of the same name wins while it runs (never a
// generation with missing objects), and the embedded server's error on an unwritable DSFS_HOME.
#include <archive.h>
#include <archive_entry.h>
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <locale.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/dataset.h"
#include "src/store/client.h"
#include "src/store/embedded_server.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"
#include "tools/ingest.h"
#include "tools/ingest_catalog.h"
#include "tools/sources.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using test::TempDir;
using test::write_file;

// This thread's LC_CTYPE is C.UTF-8 while it lives.
class ThreadLocaleUtf8 {
 public:
  ThreadLocaleUtf8() : utf8_(::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0))) {
    if (utf8_ == static_cast<locale_t>(0)) throw std::runtime_error("no C.UTF-8 locale");
    previous_ = ::uselocale(utf8_);
  }
  ~ThreadLocaleUtf8() {
    ::uselocale(previous_);
    ::freelocale(utf8_);
  }
  ThreadLocaleUtf8(const ThreadLocaleUtf8&) = delete;
  ThreadLocaleUtf8& operator=(const ThreadLocaleUtf8&) = delete;

 private:
  locale_t utf8_;
  locale_t previous_;
};

// Records what a source streams, like the Redis writer would store it.
class RecordingSink : public SourceSink {
 public:
  void put_piece(const PieceKey& key, std::string bytes, bool) override {
    std::lock_guard lock(mutex_);
    objects_[key.object_id] += bytes;
  }
  bool stop_requested() const override { return false; }
  std::string object(uint64_t id) {
    std::lock_guard lock(mutex_);
    return objects_[id];
  }

 private:
  std::mutex mutex_;
  std::map<uint64_t, std::string> objects_;
};

// ---- ImageFolder parity ------------------------------------------------------------------------

TEST(ImageFolderParity, ClassesSortAsPythonSortsTheDecodedNames) {
  // The order /usr/bin/python3 + torchvision 0.14 gives these directory names: Python decodes
  // them as UTF-8 with surrogateescape (a stray byte b becomes U+DC00+b) and sorts by code
  // point, which puts escaped bytes before U+E000 and the supplementary planes.
  const std::vector<std::string> python_order = {"Z",
                                                 "a",
                                                 "\xc3\xa9",
                                                 "\xc0\x80",
                                                 "\xc3",
                                                 "\xed\xa0\x80",
                                                 "\xf0",
                                                 "\xee\x80\x80",
                                                 "\xf0\x9f\x98\x80"};
  SourceContents contents;
  contents.directories.push_back({"", 0, 0755});
  for (auto it = python_order.rbegin(); it != python_order.rend(); ++it) {
    contents.directories.push_back({*it, 0, 0755});
    contents.files.push_back({*it + "/img.jpg", contents.files.size()});
  }
  const auto classes = image_folder_classes(contents);
  EXPECT_EQ(classes, python_order);
  for (size_t i = 0; i < python_order.size(); ++i) {
    EXPECT_EQ(image_folder_label(python_order[i] + "/img.jpg", classes), i) << i;
  }
  EXPECT_EQ(image_folder_label("\xc3\xa8/img.jpg", classes), catalog::kNoLabel);
}

TEST(ImageFolderParity, SymlinkedClassDirectoriesAreFollowedAndLoopsSkipped) {
  TempDir tmp;
  const fs::path root = tmp.path() / "train";
  write_file(root / "b_real" / "1.jpg", "one");
  write_file(tmp.path() / "elsewhere" / "a_linked" / "2.jpg", "two");
  fs::create_directory_symlink(tmp.path() / "elsewhere" / "a_linked", root / "a_linked");
  fs::create_directory_symlink("..", root / "b_real" / "loop");  // back to the root

  SourceOptions options;
  options.symlinks = SymlinkPolicy::kAll;
  RecordingSink sink;
  const SourceContents contents = make_directory_source(root, options)->read(sink);
  std::vector<std::string> paths;
  for (const auto& file : contents.files) paths.push_back(file.path);
  EXPECT_THAT(paths, ElementsAre("a_linked/2.jpg", "b_real/1.jpg"));
  EXPECT_EQ(sink.object(contents.files[0].object_id), "two");
  EXPECT_EQ(contents.skipped, 1u);  // the loop
  // torchvision: classes ['a_linked', 'b_real'], b_real/1.jpg has label 1.
  const auto classes = image_folder_classes(contents);
  EXPECT_THAT(classes, ElementsAre("a_linked", "b_real"));
  EXPECT_EQ(image_folder_label("b_real/1.jpg", classes), 1u);
}

TEST(ImageFolderParity, IngestFollowsSymlinkedDirectoriesByDefault) {
  EXPECT_EQ(IngestOptions{}.symlinks, SymlinkPolicy::kAll);
}

// ---- Archives ----------------------------------------------------------------------------------

TEST(ArchiveReview, PaxNamesInUtf8AreReadWithoutAWarningPerMember) {
  TempDir tmp;
  const fs::path tar = tmp.path() / "names.tar";
  {
    const ThreadLocaleUtf8 utf8;  // as tar(1) writes in a UTF-8 locale: pax `path` in UTF-8
    std::unique_ptr<archive, decltype(&archive_write_free)> writer(archive_write_new(),
                                                                   &archive_write_free);
    archive_write_set_format_pax(writer.get());
    ASSERT_EQ(archive_write_open_filename(writer.get(), tar.c_str()), ARCHIVE_OK);
    for (const std::string name : {"./caf\xc3\xa9/a.jpg", "./\xe6\x97\xa5/b.jpg"}) {
      std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                          &archive_entry_free);
      archive_entry_set_pathname(entry.get(), name.c_str());
      archive_entry_set_filetype(entry.get(), AE_IFREG);
      archive_entry_set_perm(entry.get(), 0644);
      archive_entry_set_size(entry.get(), 2);
      ASSERT_EQ(archive_write_header(writer.get(), entry.get()), ARCHIVE_OK);
      ASSERT_EQ(archive_write_data(writer.get(), "ok", 2), 2);
    }
  }
  auto log = std::make_shared<std::ostringstream>();
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(*log)));
  RecordingSink sink;
  SourceContents contents;
  try {
    contents = make_archive_source(tar, SourceOptions{})->read(sink);
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  ASSERT_EQ(contents.files.size(), 2u);
  EXPECT_EQ(contents.files[0].path, "caf\xc3\xa9/a.jpg");
  EXPECT_EQ(contents.files[1].path, "\xe6\x97\xa5/b.jpg");
  EXPECT_EQ(log->str(), "") << "a warning per member for well-formed names";
}

// ---- URL lists ---------------------------------------------------------------------------------

TEST(UrlListReview, PathThatAnotherEntryNeedsAsADirectoryFailsBeforeDownloading) {
  const std::string list =
      "http://h/x/f.jpg a\n"
      "http://h/unrelated.jpg\n"
      "http://h/a/b.jpg\n";
  try {
    parse_url_list(list, "urls.txt");
    FAIL() << "the collision was only found after downloading everything";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("urls.txt:3"));
    EXPECT_THAT(e.what(), HasSubstr("'a/b.jpg'"));
    EXPECT_THAT(e.what(), HasSubstr("line 1"));
  }
  // A name that merely starts like a directory is fine.
  EXPECT_EQ(parse_url_list("http://h/a-b.jpg a\nhttp://h/a.d/b.jpg\n", "ok.txt").size(), 2u);
}

// ---- Publishing under concurrent change ---------------------------------------------------------

class PublishReviewTest : public ::testing::Test {
 protected:
  // On a unix socket with an append-only file fsynced on every write: restart() brings back
  // everything Redis acknowledged, as a clean crash-and-restart would.
  PublishReviewTest()
      : redis_(test::TestRedisOptions{.unix_socket = true, .persist = true}), keys_("dsfs") {
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 60; ++i) {
        write_file(source_ / fmt::format("c{}", c) / fmt::format("{}.jpg", i),
                   std::string(1000 + i, static_cast<char>('a' + c)));
      }
    }
  }

  IngestOptions options(const fs::path& source) {
    IngestOptions o;
    o.source = source;
    o.dataset = "ds";
    o.jobs = 2;
    o.progress = ProgressStyle::kQuiet;
    return o;
  }
  // A client of the test's own, apart from the one each ingest gets (as another process's).
  std::unique_ptr<store::Client> connect() {
    return std::make_unique<store::Client>(std::vector{redis_.endpoint()});
  }
  uint64_t count_keys(const std::string& pattern) {
    return static_cast<uint64_t>(
        connect()
            ->command({"EVAL", "return #redis.call('KEYS', ARGV[1])", "0", pattern})
            .integer());
  }
  // Fails the test unless every file of the published dataset is stored.
  void expect_complete(const std::string& name) {
    const auto client = connect();
    const auto info = catalog::read_info(*client, keys_, name);
    const auto catalog = catalog::load_catalog(*client, keys_, info);
    for (uint32_t i = 0; i < catalog->entry_count(); ++i) {
      if (catalog->entry(i).is_dir) continue;
      EXPECT_EQ(client
                    ->command({"EXISTS",
                               keys_.object(name, info.generation, catalog->entry(i).object_id)})
                    .integer(),
                1)
          << catalog->path(i) << " is missing from the published generation";
    }
  }

  TempDir tmp_;
  fs::path source_ = tmp_.path() / "src";
  test::TestRedisServer redis_;
  catalog::KeySchema keys_;
};

TEST_F(PublishReviewTest, RemovedWhileIngestingPublishesNothing) {
  IngestOptions o = options(source_);
  std::atomic<bool> removed{false};
  o.on_piece_written = [&](uint64_t pieces) {
    if (pieces == 40 && !removed.exchange(true)) {
      const auto client = connect();
      catalog::remove_dataset(*client, keys_, "ds");
    }
  };
  try {
    run_ingest(*connect(), keys_, o);
    ADD_FAILURE() << "published a dataset whose first 40 objects `dsfs rm` had deleted";
    expect_complete("ds");
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no longer recorded"));
    EXPECT_THAT(e.what(), HasSubstr("nothing was published"));
  }
  EXPECT_TRUE(removed);
  const auto client = connect();
  EXPECT_THROW(catalog::read_info(*client, keys_, "ds"), catalog::DatasetNotFound);
  EXPECT_EQ(count_keys("dsfs:ds:*"), 0u) << "objects written after the rm were left behind";
}

TEST_F(PublishReviewTest, RestartThatLostAcknowledgedWritesPublishesNothing) {
  const IngestResult first = run_ingest(*connect(), keys_, options(source_));
  IngestOptions o = options(source_);
  // One reader and one connection: pieces are acknowledged in object order, so object 0 is
  // known to be acknowledged (a write still in a window would be resent after the restart).
  o.jobs = 1;
  std::atomic<bool> restarted{false};
  o.on_piece_written = [&](uint64_t pieces) {
    if (pieces == 40 && !restarted.exchange(true)) {
      {
        // What appendfsync everysec loses when Redis dies: a write it had acknowledged.
        const auto client = connect();
        const uint64_t running =
            std::stoull(std::string(client->command({"GET", keys_.next_generation("ds")}).str()));
        ASSERT_EQ(client->command({"DEL", keys_.object("ds", running, 0)}).integer(), 1);
      }
      redis_.restart();
    }
  };
  try {
    run_ingest(*connect(), keys_, o);
    ADD_FAILURE() << "published a generation missing an object lost in a Redis restart";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("restarted during the ingest and lost 1 object"));
    EXPECT_THAT(e.what(),
                HasSubstr(fmt::format("generation {} is still current", first.generation)));
  }
  EXPECT_TRUE(restarted);
  const auto client = connect();
  EXPECT_EQ(catalog::read_info(*client, keys_, "ds").generation, first.generation);
  expect_complete("ds");
}

TEST_F(PublishReviewTest, RestartThatLostNothingStillPublishes) {
  IngestOptions o = options(source_);
  std::atomic<bool> restarted{false};
  o.on_piece_written = [&](uint64_t pieces) {
    if (pieces == 40 && !restarted.exchange(true)) redis_.restart();
  };
  const IngestResult result = run_ingest(*connect(), keys_, o);
  EXPECT_TRUE(restarted);
  EXPECT_EQ(result.files, 240u);
  expect_complete("ds");
}

TEST_F(PublishReviewTest, LoserOfTwoConcurrentIngestsNamesTheWinner) {
  const fs::path other = tmp_.path() / "other";
  write_file(other / "k" / "only.jpg", "winner");
  IngestOptions o = options(source_);
  std::atomic<bool> raced{false};
  uint64_t loser = 0;
  uint64_t winner = 0;
  o.on_piece_written = [&](uint64_t pieces) {
    if (pieces == 40 && !raced.exchange(true)) {
      loser =
          std::stoull(std::string(connect()->command({"GET", keys_.next_generation("ds")}).str()));
      // Another ingest of the same name starts later and finishes first.
      winner = run_ingest(*connect(), keys_, options(other)).generation;
    }
  };
  try {
    run_ingest(*connect(), keys_, o);
    ADD_FAILURE() << "the older generation replaced the newer one";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("generation {} is current", winner)));
    EXPECT_THAT(e.what(), Not(HasSubstr("not created")));
  }
  ASSERT_GT(winner, loser);
  const auto client = connect();
  const auto info = catalog::read_info(*client, keys_, "ds");
  EXPECT_EQ(info.generation, winner);
  EXPECT_EQ(info.file_count, 1u);
  expect_complete("ds");
  EXPECT_EQ(count_keys(keys_.generation_objects_pattern("ds", loser)), 0u);
}

// ---- Embedded server
// -----------------------------------------------------------------------------

TEST(EmbeddedServerReview, UnwritableHomeSaysWhatToDo) {
  TempDir tmp;
  // The lock file cannot be opened for writing, as on a read-only DSFS_HOME whose directories
  // already exist.
  fs::create_directories(tmp.path() / "redis" / "data");
  fs::create_directories(tmp.path() / "redis" / "start.lock");
  store::EmbeddedServer server(tmp.path());
  try {
    server.start();
    FAIL() << "started with an unusable lock file";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("start.lock"));
    EXPECT_THAT(e.what(), HasSubstr("DSFS_HOME"));
  }
}

}  // namespace
}  // namespace dsfs::tools
