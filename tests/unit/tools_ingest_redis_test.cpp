// run_ingest against a real redis-server (on a unix socket in a temp dir) and, for URL lists, a
// real local HTTP server: what is published, read back raw, and what failures leave behind.
#include <archive.h>
#include <archive_entry.h>
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "src/catalog/dataset.h"
#include "src/store/client.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "tests/unit/support/child_process.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"
#include "tools/ingest.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;

using test::ChildProcess;
using test::pattern_bytes;
using test::read_file;
using test::TempDir;
using test::write_file;

// A local HTTP server (Python's http.server) over `root`, on a port it picks itself. Paths
// containing "flaky" answer 503 twice before succeeding, to exercise retries.
class HttpServer {
 public:
  explicit HttpServer(const fs::path& root, const fs::path& work) {
    const fs::path port_file = work / "http.port";
    const std::string script = R"(
import http.server, os, sys
root, port_file = sys.argv[1], sys.argv[2]
failures = {}
class Handler(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, directory=root, **kwargs)
    def log_message(self, *args):
        pass
    def do_GET(self):
        if 'flaky' in self.path and failures.get(self.path, 0) < 2:
            failures[self.path] = failures.get(self.path, 0) + 1
            self.send_error(503)
            return
        super().do_GET()
server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
with open(port_file + '.tmp', 'w') as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + '.tmp', port_file)
server.serve_forever()
)";
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{"python3", "-c", script, root.string(), port_file.string()});
    for (int attempt = 0; attempt < 200 && !fs::exists(port_file); ++attempt) {
      if (process_->exited()) throw std::runtime_error("the HTTP server exited at start");
      std::this_thread::sleep_for(50ms);
    }
    port_ = std::stoi(read_file(port_file));
  }
  std::string url(std::string_view path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + "/" + std::string(path);
  }

 private:
  std::unique_ptr<ChildProcess> process_;
  int port_ = 0;
};

class IngestRedisTest : public ::testing::Test {
 protected:
  IngestRedisTest() : redis_(test::TestRedisOptions{.unix_socket = true}), keys_("dsfs") {}

  // A client of the test's own, apart from the one each ingest gets (as another process's).
  std::unique_ptr<store::Client> connect() {
    return std::make_unique<store::Client>(std::vector{redis_.endpoint()});
  }

  IngestOptions options_for(const fs::path& source, const std::string& dataset) {
    IngestOptions options;
    options.source = source;
    options.dataset = dataset;
    options.progress = ProgressStyle::kQuiet;
    return options;
  }

  IngestResult ingest(const IngestOptions& options) {
    return run_ingest(*connect(), keys_, options);
  }

  // The bytes of a file as stored: its plain object or its chunks, per the catalogue.
  std::string stored_bytes(store::Client& client, const catalog::Catalog& catalog,
                           const std::string& dataset, uint64_t generation, uint32_t index) {
    const auto& entry = catalog.entry(index);
    const uint64_t chunks = catalog.chunk_count(index);
    if (chunks == 1) {
      const store::Reply reply =
          client.command({"GET", keys_.object(dataset, generation, entry.object_id)});
      EXPECT_TRUE(reply.is_string()) << catalog.path(index);
      return std::string(reply.str());
    }
    EXPECT_EQ(
        client.command({"EXISTS", keys_.object(dataset, generation, entry.object_id)}).integer(), 0)
        << "a chunked file also has a plain object key";
    std::string bytes;
    for (uint64_t k = 0; k < chunks; ++k) {
      const store::Reply reply =
          client.command({"GET", keys_.object_chunk(dataset, generation, entry.object_id, k)});
      EXPECT_TRUE(reply.is_string()) << catalog.path(index) << " chunk " << k;
      bytes += reply.str();
    }
    return bytes;
  }

  uint64_t count_keys(store::Client& client, const std::string& pattern) {
    uint64_t count = 0;
    client.for_each_primary([&](store::Connection& conn) {
      std::string cursor = "0";
      do {
        const store::Reply reply =
            conn.command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
        cursor = std::string(store::Reply::element_str(reply.element(0)));
        count += reply.element(1)->elements;
      } while (cursor != "0");
    });
    return count;
  }

  // Every file of the published dataset has exactly the bytes of `source_root/path`.
  void expect_matches_tree(const std::string& dataset, const fs::path& source_root,
                           size_t expected_files) {
    const auto client = connect();
    const catalog::DatasetInfo info = catalog::read_info(*client, keys_, dataset);
    const auto catalog = catalog::load_catalog(*client, keys_, info);
    EXPECT_EQ(catalog->file_count(), expected_files);
    for (uint32_t i = 0; i < catalog->entry_count(); ++i) {
      if (catalog->entry(i).is_dir) continue;
      const std::string path = catalog->path(i);
      const std::string expected = read_file(source_root / path);
      const std::string stored = stored_bytes(*client, *catalog, dataset, info.generation, i);
      EXPECT_EQ(stored.size(), expected.size()) << path;
      EXPECT_TRUE(stored == expected) << path << " differs";
      EXPECT_EQ(catalog->entry(i).size, expected.size()) << path;
      EXPECT_EQ(catalog->entry(i).checksum, XXH64(expected.data(), expected.size(), 0)) << path;
    }
  }

  TempDir tmp_;
  test::TestRedisServer redis_;
  catalog::KeySchema keys_;
};

TEST_F(IngestRedisTest, DirectoryRoundTripWithLabelsChunksMetadataAndSkippedFifo) {
  const fs::path src = tmp_.path() / "src";
  write_file(src / "cat" / "a.jpg", pattern_bytes(3000, 1));
  write_file(src / "cat" / "nested" / "deeper" / "b.jpg", pattern_bytes(100, 2));
  write_file(src / "dog" / "empty.jpg", "");
  write_file(src / "dog" / "big.bin", pattern_bytes(10'000, 3));  // over the 4 KiB chunk size
  write_file(src / "dog" / "with space ünïcødé.jpg", "awkward name");
  write_file(src / "top.txt", "no label here");
  fs::create_directories(src / "empty_class");
  ASSERT_EQ(::mkfifo((src / "dog" / "pipe").c_str(), 0644), 0);
  write_file(tmp_.path() / "meta.jsonl",
             "{\"path\": \"cat/a.jpg\", \"caption\": \"a cat\"}\n"
             "{\"path\": \"not/in/dataset.jpg\", \"x\": 1}\n");

  IngestOptions options = options_for(src, "pets");
  options.chunk_size = 4096;
  options.jobs = 3;
  options.metadata_file = tmp_.path() / "meta.jsonl";
  const IngestResult result = ingest(options);
  EXPECT_EQ(result.files, 6u);
  EXPECT_EQ(result.skipped, 1u);
  EXPECT_EQ(result.classes, 3u);

  const auto client = connect();
  EXPECT_THAT(catalog::list_datasets(*client, keys_), ::testing::Contains("pets"));
  const catalog::DatasetInfo info = catalog::read_info(*client, keys_, "pets");
  EXPECT_EQ(info.generation, result.generation);
  EXPECT_EQ(info.file_count, 6u);
  EXPECT_EQ(info.total_bytes, 3000u + 100 + 0 + 10'000 + 12 + 13);
  EXPECT_EQ(info.class_count, 3u);
  EXPECT_EQ(info.chunk_size, 4096u);
  EXPECT_EQ(info.source, fs::absolute(src).lexically_normal().string());
  expect_matches_tree("pets", src, 6);

  const auto catalog = catalog::load_catalog(*client, keys_, info);
  EXPECT_THAT(catalog->classes(), ::testing::ElementsAre("cat", "dog", "empty_class"));
  EXPECT_EQ(catalog->entry(*catalog->find("cat/nested/deeper/b.jpg")).label, 0u);
  EXPECT_EQ(catalog->entry(*catalog->find("dog/with space ünïcødé.jpg")).label, 1u);
  EXPECT_EQ(catalog->entry(*catalog->find("top.txt")).label, catalog::kNoLabel);
  EXPECT_EQ(catalog->chunk_count(*catalog->find("dog/big.bin")), 3u);
  EXPECT_TRUE(catalog->find("empty_class").has_value());
  EXPECT_FALSE(catalog->find("dog/pipe").has_value());
  EXPECT_EQ(nlohmann::json::parse(catalog->metadata(*catalog->find("cat/a.jpg"))),
            nlohmann::json::parse(R"({"caption": "a cat"})"));
  EXPECT_TRUE(catalog->metadata(*catalog->find("dog/big.bin")).empty());
  // Objects: 5 plain + 3 chunks, nothing else under this generation.
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("pets", info.generation)), 8u);
}

TEST_F(IngestRedisTest, ReingestReplacesAtomicallyAndCollectsOldGenerations) {
  const fs::path src = tmp_.path() / "src";
  write_file(src / "a" / "1.bin", "version one");
  const IngestResult first = ingest(options_for(src, "ds"));

  write_file(src / "a" / "1.bin", "version two, longer");
  write_file(src / "b" / "2.bin", "new file");
  IngestOptions second_options = options_for(src, "ds");
  second_options.keep_generations = 1;
  const IngestResult second = ingest(second_options);
  EXPECT_GT(second.generation, first.generation);
  expect_matches_tree("ds", src, 2);

  const auto client = connect();
  const catalog::DatasetInfo info = catalog::read_info(*client, keys_, "ds");
  EXPECT_EQ(info.generation, second.generation);
  EXPECT_EQ(info.previous_generation, first.generation);
  // keep 1: the first generation stays for readers that still hold it.
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("ds", first.generation)), 1u);

  IngestOptions third_options = options_for(src, "ds");
  third_options.keep_generations = 0;
  const IngestResult third = ingest(third_options);
  EXPECT_GT(third.garbage_keys_deleted, 0u);
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("ds", first.generation)), 0u);
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("ds", second.generation)), 0u);
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("ds", third.generation)), 2u);
  expect_matches_tree("ds", src, 2);
}

TEST_F(IngestRedisTest, TarSource) {
  const fs::path tar = tmp_.path() / "data.tar";
  const std::string big = pattern_bytes(9000, 5);
  {
    std::unique_ptr<archive, decltype(&archive_write_free)> writer(archive_write_new(),
                                                                   &archive_write_free);
    archive_write_set_format_pax(writer.get());
    ASSERT_EQ(archive_write_open_filename(writer.get(), tar.c_str()), ARCHIVE_OK);
    const std::vector<std::pair<std::string, std::string>> members = {
        {"n01/x.JPEG", "jpeg bytes"}, {"n01/big.bin", big}, {"n02/y.JPEG", ""}};
    for (const auto& [path, content] : members) {
      std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                          &archive_entry_free);
      archive_entry_set_pathname(entry.get(), path.c_str());
      archive_entry_set_filetype(entry.get(), AE_IFREG);
      archive_entry_set_perm(entry.get(), 0644);
      archive_entry_set_size(entry.get(), static_cast<la_int64_t>(content.size()));
      ASSERT_EQ(archive_write_header(writer.get(), entry.get()), ARCHIVE_OK);
      if (!content.empty()) archive_write_data(writer.get(), content.data(), content.size());
    }
    ASSERT_EQ(archive_write_close(writer.get()), ARCHIVE_OK);
  }
  IngestOptions options = options_for(tar, "tarred");
  options.chunk_size = 4096;
  const IngestResult result = ingest(options);
  EXPECT_EQ(result.files, 3u);
  EXPECT_EQ(result.classes, 2u);

  const auto client = connect();
  const catalog::DatasetInfo info = catalog::read_info(*client, keys_, "tarred");
  const auto catalog = catalog::load_catalog(*client, keys_, info);
  const uint32_t big_index = *catalog->find("n01/big.bin");
  EXPECT_EQ(catalog->chunk_count(big_index), 3u);
  EXPECT_EQ(stored_bytes(*client, *catalog, "tarred", info.generation, big_index), big);
  EXPECT_EQ(catalog->entry(big_index).checksum, XXH64(big.data(), big.size(), 0));
  EXPECT_EQ(
      stored_bytes(*client, *catalog, "tarred", info.generation, *catalog->find("n01/x.JPEG")),
      "jpeg bytes");
  EXPECT_EQ(catalog->entry(*catalog->find("n02/y.JPEG")).label, 1u);
}

TEST_F(IngestRedisTest, UrlListWithRetriesAndPathColumn) {
  const fs::path served = tmp_.path() / "www";
  write_file(served / "cls a" / "one.jpg", pattern_bytes(2000, 6));
  write_file(served / "cls b" / "flaky.jpg", pattern_bytes(5000, 7));
  write_file(served / "misc" / "renamed.bin", "stored under another path");
  HttpServer http(served, tmp_.path());
  const fs::path list = tmp_.path() / "urls.txt";
  write_file(list, "# training images\n" + http.url("cls%20a/one.jpg") + "\n" +
                       http.url("cls%20b/flaky.jpg") + "\n\n" + http.url("misc/renamed.bin") +
                       "   cls a/two.bin\n");

  IngestOptions options = options_for(list, "web");
  options.chunk_size = 4096;
  const IngestResult result = ingest(options);
  EXPECT_EQ(result.files, 3u);
  EXPECT_EQ(result.classes, 2u);

  const auto client = connect();
  const catalog::DatasetInfo info = catalog::read_info(*client, keys_, "web");
  EXPECT_EQ(info.source, fs::absolute(list).string());
  const auto catalog = catalog::load_catalog(*client, keys_, info);
  EXPECT_THAT(catalog->classes(), ::testing::ElementsAre("cls a", "cls b"));
  auto stored = [&](const std::string& path) {
    const auto index = catalog->find(path);
    EXPECT_TRUE(index.has_value()) << path;
    return index ? stored_bytes(*client, *catalog, "web", info.generation, *index) : std::string();
  };
  EXPECT_EQ(stored("cls a/one.jpg"), read_file(served / "cls a" / "one.jpg"));
  EXPECT_EQ(stored("cls b/flaky.jpg"), read_file(served / "cls b" / "flaky.jpg"));
  EXPECT_EQ(stored("cls a/two.bin"), "stored under another path");
  EXPECT_EQ(catalog->entry(*catalog->find("cls b/flaky.jpg")).label, 1u);
}

TEST_F(IngestRedisTest, UrlList404FailsNamingTheUrlAndPublishesNothing) {
  const fs::path served = tmp_.path() / "www";
  write_file(served / "a" / "ok.jpg", pattern_bytes(3000, 8));
  HttpServer http(served, tmp_.path());
  const fs::path list = tmp_.path() / "urls.txt";
  write_file(list, http.url("a/ok.jpg") + "\n" + http.url("a/missing.jpg") + "\n");

  try {
    ingest(options_for(list, "broken"));
    FAIL() << "an ingest with a 404 succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("a/missing.jpg"));
    EXPECT_THAT(e.what(), HasSubstr("404"));
    EXPECT_THAT(e.what(), HasSubstr("nothing was published"));
  }
  const auto client = connect();
  std::vector<std::string> unpublished;
  EXPECT_THAT(catalog::list_datasets(*client, keys_, &unpublished),
              Not(::testing::Contains("broken")));
  // Nothing left to name: `dsfs list` said the failed first ingest had left what it wrote.
  EXPECT_THAT(unpublished, ::testing::IsEmpty());
  EXPECT_THROW(catalog::read_info(*client, keys_, "broken"), catalog::DatasetNotFound);
  EXPECT_EQ(count_keys(*client, keys_.dataset_objects_pattern("broken")), 0u);
}

TEST_F(IngestRedisTest, InterruptedIngestLeavesThePreviousGenerationIntact) {
  const fs::path src = tmp_.path() / "src";
  // Names made with fmt: "f" + std::to_string(i) trips GCC 12's false -Wrestrict at -O3.
  for (int i = 0; i < 20; ++i) {
    write_file(src / "c" / fmt::format("f{}", i), pattern_bytes(1000, i));
  }
  const IngestResult first = ingest(options_for(src, "stable"));

  // Change the source, then stop the second ingest part-way, as SIGINT would.
  for (int i = 0; i < 20; ++i) {
    write_file(src / "c" / fmt::format("f{}", i), pattern_bytes(1500, 100 + i));
  }
  std::atomic<bool> stop{false};
  IngestOptions options = options_for(src, "stable");
  options.jobs = 1;
  options.stop = &stop;
  uint64_t interrupted_generation = 0;
  options.on_piece_written = [&](uint64_t pieces) {
    if (pieces != 5) return;
    stop = true;
    // The generation this ingest writes: the counter's value (a later one is not begun).
    interrupted_generation = std::stoull(
        std::string(connect()->command({"GET", keys_.next_generation("stable")}).str()));
  };
  try {
    ingest(options);
    FAIL() << "the interrupted ingest published";
  } catch (const IngestInterrupted& e) {
    EXPECT_THAT(e.what(), HasSubstr("nothing was published"));
    EXPECT_THAT(e.what(),
                HasSubstr(fmt::format("generation {} is still current", first.generation)));
  }

  const auto client = connect();
  const catalog::DatasetInfo info = catalog::read_info(*client, keys_, "stable");
  EXPECT_EQ(info.generation, first.generation);
  const auto catalog = catalog::load_catalog(*client, keys_, info);
  for (int i = 0; i < 20; ++i) {
    const std::string path = "c/f" + std::to_string(i);
    EXPECT_EQ(stored_bytes(*client, *catalog, "stable", info.generation, *catalog->find(path)),
              pattern_bytes(1000, i))
        << path;
  }
  // What the interrupted generation wrote was removed, and it is no longer tracked.
  ASSERT_GT(interrupted_generation, first.generation);
  EXPECT_EQ(count_keys(*client, keys_.generation_objects_pattern("stable", interrupted_generation)),
            0u);
  EXPECT_EQ(client
                ->command({"SISMEMBER", keys_.generations("stable"),
                           std::to_string(interrupted_generation)})
                .integer(),
            0);
}

TEST_F(IngestRedisTest, WritersReconnectWhenRedisDropsConnections) {
  const fs::path src = tmp_.path() / "src";
  for (int i = 0; i < 40; ++i) {
    write_file(src / "c" / fmt::format("f{}", i), pattern_bytes(2000, i));
  }
  IngestOptions options = options_for(src, "resilient");
  options.jobs = 2;
  std::atomic<bool> killed{false};
  options.on_piece_written = [&](uint64_t pieces) {
    if (pieces >= 10 && !killed.exchange(true)) {
      // Drops every other client: the writers and the ingest client's idle pooled connections.
      connect()->command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}).expect_ok("KILL");
    }
  };
  const IngestResult result = ingest(options);
  EXPECT_TRUE(killed);
  EXPECT_EQ(result.files, 40u);
  expect_matches_tree("resilient", src, 40);
}

TEST(IngestRedisErrors, RedisOutOfMemoryIsAClearError) {
  TempDir tmp;
  test::TestRedisServer redis(test::TestRedisOptions{
      .unix_socket = true,
      .extra_args = {"--maxmemory", "2mb", "--maxmemory-policy", "noeviction"}});
  const fs::path src = tmp.path() / "src";
  for (int i = 0; i < 8; ++i) {
    write_file(src / fmt::format("f{}", i), pattern_bytes(1 << 20, i));
  }
  IngestOptions options;
  options.source = src;
  options.dataset = "toobig";
  options.progress = ProgressStyle::kQuiet;
  store::Client client({redis.endpoint()});
  try {
    run_ingest(client, catalog::KeySchema("dsfs"), options);
    FAIL() << "an ingest larger than maxmemory succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("maxmemory"));
    EXPECT_THAT(e.what(), HasSubstr("nothing was published"));
  }
  EXPECT_THROW(catalog::read_info(client, catalog::KeySchema("dsfs"), "toobig"),
               catalog::DatasetNotFound);
}

TEST(IngestRedisErrors, UnreachableRedisNamesTheEndpoint) {
  TempDir tmp;
  write_file(tmp.path() / "src" / "a", "x");
  store::RedisEndpoint nowhere;
  nowhere.transport = store::RedisEndpoint::Transport::kUnix;
  nowhere.socket_path = (tmp.path() / "no-such.sock").string();
  IngestOptions options;
  options.source = tmp.path() / "src";
  options.dataset = "x";
  options.progress = ProgressStyle::kQuiet;
  store::Client client({nowhere}, store::ClientOptions{.retry_budget = 300ms});
  try {
    run_ingest(client, catalog::KeySchema("dsfs"), options);
    FAIL() << "ingest into an unreachable Redis succeeded";
  } catch (const store::ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no-such.sock"));
  }
}

// Redis gone after the client first reached it (as when it stops between two commands): the
// error names it too.
TEST(IngestRedisErrors, RedisGoneAwayNamesTheEndpoint) {
  TempDir tmp;
  write_file(tmp.path() / "src" / "a", "x");
  test::TestRedisServer redis(test::TestRedisOptions{.unix_socket = true});
  store::Client client({redis.endpoint()}, store::ClientOptions{.retry_budget = 300ms});
  client.connect();
  redis.stop();
  IngestOptions options;
  options.source = tmp.path() / "src";
  options.dataset = "x";
  options.progress = ProgressStyle::kQuiet;
  try {
    run_ingest(client, catalog::KeySchema("dsfs"), options);
    FAIL() << "ingest into an unreachable Redis succeeded";
  } catch (const store::ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr(redis.socket_path().string()));
  }
}

}  // namespace
}  // namespace dsfs::tools
