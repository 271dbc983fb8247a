// Ingest logic that needs no Redis: source detection, URL lists, path normalisation, labels,
// metadata, chunk splitting, and the directory and archive readers against an in-memory sink.
#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <xxhash.h>
#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "tests/unit/support/files.h"
#include "tools/ingest.h"
#include "tools/ingest_catalog.h"
#include "tools/ingest_object.h"
#include "tools/progress.h"
#include "tools/sources.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using test::pattern_bytes;
using test::TempDir;
using test::write_file;

uint64_t xxh64(std::string_view bytes) {
  return XXH64(bytes.data(), bytes.size(), 0);
}

// Collects pieces in memory, keyed like Redis keys would be.
class MemorySink : public SourceSink {
 public:
  using Key = std::tuple<uint64_t, bool, uint64_t>;
  void put_piece(const PieceKey& key, std::string bytes, bool completes_object) override {
    std::lock_guard lock(mutex_);
    pieces_[Key{key.object_id, key.chunked, key.chunk_index}] = std::move(bytes);
    if (completes_object) {
      ++objects_completed_;
      EXPECT_TRUE(completed_ids_.insert(key.object_id).second) << "object completed twice";
    }
  }
  bool stop_requested() const override { return stop_; }

  // The object's bytes reassembled from its pieces, checking they are exactly one plain piece
  // or chunks 0..n-1.
  std::string object(uint64_t id) const {
    std::lock_guard lock(mutex_);
    if (const auto it = pieces_.find(Key{id, false, 0}); it != pieces_.end()) {
      EXPECT_EQ(pieces_.count(Key{id, true, 0}), 0u) << "object " << id << " is both";
      return it->second;
    }
    std::string bytes;
    for (uint64_t k = 0;; ++k) {
      const auto it = pieces_.find(Key{id, true, k});
      if (it == pieces_.end()) break;
      bytes += it->second;
    }
    return bytes;
  }
  size_t piece_count() const {
    std::lock_guard lock(mutex_);
    return pieces_.size();
  }
  std::map<Key, std::string> pieces() const {
    std::lock_guard lock(mutex_);
    return pieces_;
  }

  std::atomic<bool> stop_{false};
  uint64_t objects_completed_ = 0;
  std::set<uint64_t> completed_ids_;

 private:
  mutable std::mutex mutex_;
  std::map<Key, std::string> pieces_;
};

const FileRecord* find_file(const SourceContents& contents, std::string_view path) {
  for (const auto& file : contents.files) {
    if (file.path == path) return &file;
  }
  return nullptr;
}

const DirectoryRecord* find_directory(const SourceContents& contents, std::string_view path) {
  for (const auto& directory : contents.directories) {
    if (directory.path == path) return &directory;
  }
  return nullptr;
}

// ---- chunk splitting -------------------------------------------------------------------------

struct SplitCase {
  size_t size;
  uint64_t chunk_size;
  size_t append_block;
  size_t expected_pieces;
  bool chunked;
};

class ObjectStreamSplit : public ::testing::TestWithParam<SplitCase> {};

TEST_P(ObjectStreamSplit, SplitsIntoPlainObjectOrChunksAndChecksumsTheWhole) {
  const SplitCase c = GetParam();
  const std::string content = pattern_bytes(c.size, 7);
  MemorySink sink;
  ObjectStream stream(sink, 42, c.chunk_size, catalog::ChecksumKind::kXxh64, c.size);
  for (size_t offset = 0; offset < content.size(); offset += c.append_block) {
    stream.append(std::string_view(content).substr(offset, c.append_block));
  }
  const FileDigest digest = stream.finish();
  EXPECT_EQ(digest.size, c.size);
  EXPECT_EQ(digest.checksum, xxh64(content));
  EXPECT_EQ(sink.piece_count(), c.expected_pieces);
  const auto pieces = sink.pieces();
  EXPECT_EQ(pieces.count({42, false, 0}), c.chunked ? 0u : 1u);
  for (const auto& [key, bytes] : pieces) {
    EXPECT_LE(bytes.size(), c.chunk_size);
    if (std::get<1>(key)) {
      EXPECT_FALSE(bytes.empty()) << "an empty trailing chunk was stored";
    }
  }
  EXPECT_EQ(sink.object(42), content);
  EXPECT_EQ(sink.objects_completed_, 1u);
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, ObjectStreamSplit,
    ::testing::Values(SplitCase{0, 10, 4, 1, false},    // empty file: one empty plain object
                      SplitCase{9, 10, 4, 1, false},    // below the chunk size
                      SplitCase{10, 10, 3, 1, false},   // exactly the chunk size: still plain
                      SplitCase{11, 10, 3, 2, true},    // one byte over: two chunks
                      SplitCase{20, 10, 7, 2, true},    // exact multiple: no empty third chunk
                      SplitCase{21, 10, 21, 3, true},   // one append spanning three chunks
                      SplitCase{1000, 64, 1, 16, true}  // byte-at-a-time appends
                      ));

TEST(ObjectStream, NoChecksumGivesZeroAndRestartDiscardsEarlierBytes) {
  MemorySink sink;
  ObjectStream stream(sink, 1, 4, catalog::ChecksumKind::kNone);
  stream.append("stale bytes from a failed download");
  stream.restart();
  stream.append("fresh");
  const FileDigest digest = stream.finish();
  EXPECT_EQ(digest.size, 5u);
  EXPECT_EQ(digest.checksum, 0u);
  // Readers fetch ceil(size / chunk) chunks, so stale chunks past the new end are never read.
  const auto pieces = sink.pieces();
  EXPECT_EQ(pieces.at({1, true, 0}), "fres");
  EXPECT_EQ(pieces.at({1, true, 1}), "h");
}

TEST(ObjectStream, RejectsZeroChunkSize) {
  MemorySink sink;
  EXPECT_THROW(ObjectStream(sink, 1, 0, catalog::ChecksumKind::kXxh64), std::invalid_argument);
}

// ---- URL lists and paths ---------------------------------------------------------------------

TEST(UrlToRelativePath, StripsLeadingSlashAndPercentDecodes) {
  EXPECT_EQ(url_to_relative_path("http://example.com/train/n01/img%20one.JPEG"),
            "train/n01/img one.JPEG");
  EXPECT_EQ(url_to_relative_path("https://h:8443/a/%C3%A9t%C3%A9.jpg?sig=1#frag"), "a/été.jpg");
  EXPECT_EQ(url_to_relative_path("http://h/a//b/./c.bin"), "a/b/c.bin");
}

// A URL list's passwords and presigned signatures were printed as they were in every fetch
// warning and error.
TEST(UrlForMessages, HidesPasswordsAndQueries) {
  EXPECT_EQ(url_for_messages("http://h/a/b.jpg"), "http://h/a/b.jpg");
  EXPECT_EQ(url_for_messages("http://user:HttpSecret9@127.0.0.1:42999/a.jpg"),
            "http://user:***@127.0.0.1:42999/a.jpg");
  EXPECT_EQ(url_for_messages("https://bucket.s3/k.jpg?X-Amz-Signature=abc&X-Amz-Date=1"),
            "https://bucket.s3/k.jpg?***");
  // Not a URL curl takes: everything that could be a secret goes.
  EXPECT_EQ(url_for_messages("http://us er:pw@h st/x?sig=1"), "http://***@h st/x");
  EXPECT_EQ(url_for_messages("ftp\x1b://x"), "ftp\\x1b://x");
  EXPECT_THAT(url_for_messages("http://u:Secret9@h"), Not(HasSubstr("Secret9")));
}

TEST(UrlToRelativePath, RejectsUrlsWithoutAFile) {
  EXPECT_THROW(url_to_relative_path("http://example.com/"), std::invalid_argument);
  EXPECT_THROW(url_to_relative_path("http://example.com"), std::invalid_argument);
  EXPECT_THROW(url_to_relative_path("not a url"), std::invalid_argument);
}

TEST(NormalizeRelativePath, CanonicalisesAndRejectsClimbing) {
  EXPECT_EQ(normalize_relative_path("./a//b/./c/", "t"), "a/b/c");
  EXPECT_EQ(normalize_relative_path("/abs/x", "t"), "abs/x");
  EXPECT_EQ(normalize_relative_path("./", "t"), "");
  EXPECT_EQ(normalize_relative_path("dir with space/ü.jpg", "t"), "dir with space/ü.jpg");
  try {
    normalize_relative_path("a/../../etc/passwd", "archive 'x.tar'");
    FAIL() << "'..' was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("archive 'x.tar'"));
    EXPECT_THAT(e.what(), HasSubstr(".."));
  }
  EXPECT_THROW(normalize_relative_path(std::string(300, 'n'), "t"), std::invalid_argument);
}

TEST(ParseUrlList, SkipsCommentsAndBlanksAndReadsTheOptionalPathColumn) {
  const std::string text =
      "# a comment\n"
      "\n"
      "http://h/a/1.jpg\r\n"
      "   https://h/x?id=2   cls b/2 two.jpg  \n"
      "HTTP://h/c/3.jpg\n";
  const auto entries = parse_url_list(text, "list.txt");
  ASSERT_EQ(entries.size(), 3u);
  EXPECT_EQ(entries[0].url, "http://h/a/1.jpg");
  EXPECT_EQ(entries[0].relative_path, "a/1.jpg");
  EXPECT_EQ(entries[0].line, 3u);
  EXPECT_EQ(entries[1].url, "https://h/x?id=2");
  EXPECT_EQ(entries[1].relative_path, "cls b/2 two.jpg");
  EXPECT_EQ(entries[2].relative_path, "c/3.jpg");
}

TEST(ParseUrlList, ErrorsNameTheListAndLine) {
  auto error_of = [](const std::string& text) {
    try {
      parse_url_list(text, "urls.txt");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("http://h/a.jpg\nftp://h/b.jpg\n"), HasSubstr("urls.txt:2"));
  EXPECT_THAT(error_of("http://h/a.jpg\nhttp://other/a.jpg\n"), HasSubstr("listed twice"));
  EXPECT_THAT(error_of("http://h/\n"), HasSubstr("urls.txt:1"));
  EXPECT_THAT(error_of("http://h/a.jpg ../escape.jpg\n"), HasSubstr("urls.txt:1"));
  EXPECT_THAT(error_of("# only comments\n\n"), HasSubstr("lists no URLs"));
}

TEST(LooksLikeUrlList, NeedsEveryContentLineToBeAnHttpUrl) {
  EXPECT_TRUE(looks_like_url_list("# c\nhttp://a/b\n\nhttps://c/d x\n"));
  EXPECT_FALSE(looks_like_url_list("http://a/b\nplain text\n"));
  EXPECT_FALSE(looks_like_url_list("# only a comment\n"));
  EXPECT_FALSE(looks_like_url_list(std::string("http://a/b\0\n", 12)));
}

// ---- source detection ------------------------------------------------------------------------

TEST(DetectSourceKind, DirectoriesArchivesUrlListsAndErrors) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "tree";
  fs::create_directories(dir);
  EXPECT_EQ(detect_source_kind(dir), SourceKind::kDirectory);

  write_file(tmp.path() / "urls.txt", "# list\nhttp://127.0.0.1/a.jpg\n");
  EXPECT_EQ(detect_source_kind(tmp.path() / "urls.txt"), SourceKind::kUrlList);

  write_file(tmp.path() / "named.tar.gz", "not even gzip, but the name says archive");
  EXPECT_EQ(detect_source_kind(tmp.path() / "named.tar.gz"), SourceKind::kArchive);

  // A tar under a name that does not say so is recognised by content.
  {
    std::unique_ptr<archive, decltype(&archive_write_free)> writer(archive_write_new(),
                                                                   &archive_write_free);
    archive_write_set_format_pax_restricted(writer.get());
    ASSERT_EQ(archive_write_open_filename(writer.get(), (tmp.path() / "blob.bin").c_str()),
              ARCHIVE_OK);
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                        &archive_entry_free);
    archive_entry_set_pathname(entry.get(), "x.txt");
    archive_entry_set_filetype(entry.get(), AE_IFREG);
    archive_entry_set_perm(entry.get(), 0644);
    archive_entry_set_size(entry.get(), 2);
    ASSERT_EQ(archive_write_header(writer.get(), entry.get()), ARCHIVE_OK);
    ASSERT_EQ(archive_write_data(writer.get(), "hi", 2), 2);
    ASSERT_EQ(archive_write_close(writer.get()), ARCHIVE_OK);
  }
  EXPECT_EQ(detect_source_kind(tmp.path() / "blob.bin"), SourceKind::kArchive);

  write_file(tmp.path() / "notes.txt", "just some notes\n");
  try {
    detect_source_kind(tmp.path() / "notes.txt");
    FAIL() << "a plain text file was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("notes.txt"));
  }
  write_file(tmp.path() / "empty", "");
  EXPECT_THROW(detect_source_kind(tmp.path() / "empty"), std::runtime_error);
  try {
    detect_source_kind(tmp.path() / "missing");
    FAIL() << "a missing source was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not exist"));
  }
  ASSERT_EQ(::mkfifo((tmp.path() / "fifo").c_str(), 0644), 0);
  EXPECT_THROW(detect_source_kind(tmp.path() / "fifo"), std::runtime_error);
}

TEST(HasArchiveExtension, KnownSuffixesCaseInsensitive) {
  EXPECT_TRUE(has_archive_extension("train.tar"));
  EXPECT_TRUE(has_archive_extension("train.TAR.GZ"));
  EXPECT_TRUE(has_archive_extension("train.tgz"));
  EXPECT_TRUE(has_archive_extension("train.tar.zst"));
  EXPECT_FALSE(has_archive_extension("urls.txt"));
  EXPECT_FALSE(has_archive_extension("tar"));
}

// ---- labels and metadata ---------------------------------------------------------------------

TEST(ImageFolderLabels, FirstLevelDirectoriesSortedBytewiseIncludingEmptyOnes) {
  SourceContents contents;
  contents.directories = {{"", 0, 0755},      {"b", 0, 0755},     {"B", 0, 0755}, {"a", 0, 0755},
                          {"a/sub", 0, 0755}, {"empty", 0, 0755}, {"é", 0, 0755}};
  contents.files = {{"a/sub/1.jpg", 0}, {"b/2.jpg", 1}, {"root.txt", 2}, {"implied/3.jpg", 3}};
  const auto classes = image_folder_classes(contents);
  // Bytewise: uppercase before lowercase, UTF-8 after ASCII (as Python sorts str).
  EXPECT_THAT(classes, ElementsAre("B", "a", "b", "empty", "implied", "é"));
  EXPECT_EQ(image_folder_label("a/sub/1.jpg", classes), 1u);
  EXPECT_EQ(image_folder_label("b/2.jpg", classes), 2u);
  EXPECT_EQ(image_folder_label("implied/3.jpg", classes), 4u);
  EXPECT_EQ(image_folder_label("root.txt", classes), catalog::kNoLabel);
  EXPECT_EQ(image_folder_label("unknown/x.jpg", classes), catalog::kNoLabel);
}

TEST(ParseLabelMode, AutoNoneAndError) {
  EXPECT_EQ(parse_label_mode("auto"), LabelMode::kAuto);
  EXPECT_EQ(parse_label_mode("none"), LabelMode::kNone);
  EXPECT_THROW(parse_label_mode("folders"), std::invalid_argument);
}

TEST(ParseMetadata, KeepsEveryMemberButPath) {
  std::istringstream in(
      "{\"path\": \"a/1.jpg\", \"caption\": \"a cat\", \"bbox\": [1, 2, 3, 4]}\n"
      "\n"
      "{\"path\": \"./b//2.jpg\"}\n");
  const SampleMetadata metadata = parse_metadata_jsonl(in, "meta.jsonl");
  ASSERT_EQ(metadata.by_path.size(), 2u);
  const auto parsed = nlohmann::json::parse(metadata.by_path.at("a/1.jpg"));
  EXPECT_EQ(parsed, nlohmann::json::parse(R"({"caption": "a cat", "bbox": [1, 2, 3, 4]})"));
  EXPECT_EQ(metadata.by_path.at("b/2.jpg"), "");
}

TEST(ParseMetadata, ErrorsNameFileAndLine) {
  auto error_of = [](const std::string& text) {
    std::istringstream in(text);
    try {
      parse_metadata_jsonl(in, "meta.jsonl");
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(error_of("{\"path\": \"a\"}\n{not json\n"), HasSubstr("meta.jsonl:2"));
  EXPECT_THAT(error_of("[1, 2]\n"), HasSubstr("meta.jsonl:1: expected a JSON object"));
  EXPECT_THAT(error_of("{\"caption\": \"x\"}\n"), HasSubstr("\"path\""));
  EXPECT_THAT(error_of("{\"path\": 3}\n"), HasSubstr("meta.jsonl:1"));
  EXPECT_THAT(error_of("{\"path\": \"a\"}\n{\"path\": \"a\"}\n"), HasSubstr("meta.jsonl:2"));
  // A number out of range, a string that is not UTF-8: the place was missing (found by an audit).
  EXPECT_THAT(error_of("{\"path\": \"a\", \"v\": 1e400}\n"), HasSubstr("meta.jsonl:1"));
  EXPECT_THAT(error_of("{\"path\": \"a\", \"v\": \"\xff\"}\n"), HasSubstr("meta.jsonl:1"));
}

TEST(BuildCatalog, LabelsMetadataAndUnknownMetadataPaths) {
  SourceContents contents;
  contents.directories = {{"", 5, 0755}, {"cat", 6, 0750}, {"dog", 7, 0755}, {"zebra", 8, 0755}};
  contents.files = {{"cat/1.jpg", 0, 3, 100, 0644, 11},
                    {"dog/2.jpg", 1, 4, 200, 0600, 22},
                    {"README", 2, 5, 300, 0644, 33}};
  SampleMetadata metadata;
  metadata.by_path["dog/2.jpg"] = R"({"breed":"corgi"})";
  metadata.by_path["missing.jpg"] = R"({"x":1})";
  CatalogBuildStats stats;
  const catalog::Catalog catalog = build_catalog(contents, LabelMode::kAuto, &metadata,
                                                 catalog::ChecksumKind::kXxh64, 1024, &stats);
  EXPECT_EQ(stats.metadata_attached, 1u);
  EXPECT_EQ(stats.metadata_unknown_paths, 1u);
  EXPECT_THAT(catalog.classes(), ElementsAre("cat", "dog", "zebra"));
  EXPECT_EQ(catalog.file_count(), 3u);
  EXPECT_EQ(catalog.total_bytes(), 12u);
  const auto dog = catalog.find("dog/2.jpg");
  ASSERT_TRUE(dog);
  EXPECT_EQ(catalog.entry(*dog).label, 1u);
  EXPECT_EQ(catalog.entry(*dog).object_id, 1u);
  EXPECT_EQ(catalog.entry(*dog).checksum, 22u);
  EXPECT_EQ(catalog.entry(*dog).mode, 0600u);
  EXPECT_EQ(catalog.metadata(*dog), R"({"breed":"corgi"})");
  const auto readme = catalog.find("README");
  ASSERT_TRUE(readme);
  EXPECT_EQ(catalog.entry(*readme).label, catalog::kNoLabel);
  const auto cat_dir = catalog.find("cat");
  ASSERT_TRUE(cat_dir);
  EXPECT_EQ(catalog.entry(*cat_dir).mode, 0750u);
  EXPECT_EQ(catalog.entry(*cat_dir).mtime_ns, 6);
  EXPECT_EQ(catalog.entry(catalog::kRootIndex).mtime_ns, 5);

  const catalog::Catalog unlabeled =
      build_catalog(contents, LabelMode::kNone, nullptr, catalog::ChecksumKind::kXxh64, 1024);
  EXPECT_TRUE(unlabeled.classes().empty());
  EXPECT_EQ(unlabeled.entry(*unlabeled.find("cat/1.jpg")).label, catalog::kNoLabel);
}

// ---- directory source ------------------------------------------------------------------------

TEST(DirectorySource, WalksSortedSkipsSpecialFilesAndReadsEveryFile) {
  TempDir tmp;
  const fs::path root = tmp.path() / "src";
  write_file(root / "b_class" / "x.jpg", pattern_bytes(1000, 1));
  write_file(root / "a_class" / "nested" / "deep" / "y.jpg", pattern_bytes(50, 2));
  write_file(root / "a_class" / "empty.bin", "");
  write_file(root / "a_class" / "name with spaces ü.jpg", "spaces");
  write_file(root / "big.bin", pattern_bytes(10'000, 3));
  fs::create_directories(root / "empty_dir");
  ASSERT_EQ(::mkfifo((root / "a_class" / "pipe").c_str(), 0644), 0);
  fs::create_symlink("b_class/x.jpg", root / "link_to_file.jpg");
  fs::create_symlink("b_class", root / "link_to_dir");
  fs::create_symlink("nowhere", root / "dangling");
  ::chmod((root / "b_class" / "x.jpg").c_str(), 0600);
  const timeval times[2] = {{1'600'000'000, 123'456}, {1'600'000'000, 123'456}};
  ASSERT_EQ(::utimes((root / "b_class" / "x.jpg").c_str(), times), 0);

  SourceOptions options;
  options.chunk_size = 4096;
  options.parallelism = 3;
  options.symlinks = SymlinkPolicy::kAll;  // links inside the tree are followed, as ImageFolder
  auto source = make_directory_source(root, options);
  MemorySink sink;
  const SourceContents contents = source->read(sink);

  std::vector<std::string> file_paths;
  for (const auto& file : contents.files) file_paths.push_back(file.path);
  // Sorted depth-first walk; object ids follow it.
  EXPECT_THAT(file_paths, ElementsAre("a_class/empty.bin", "a_class/name with spaces ü.jpg",
                                      "a_class/nested/deep/y.jpg", "b_class/x.jpg", "big.bin",
                                      "link_to_dir/x.jpg", "link_to_file.jpg"));
  for (size_t i = 0; i < contents.files.size(); ++i) {
    EXPECT_EQ(contents.files[i].object_id, i);
    const std::string expected = [&] {
      std::ifstream in(root / contents.files[i].path, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    EXPECT_EQ(sink.object(i), expected) << contents.files[i].path;
    EXPECT_EQ(contents.files[i].size, expected.size());
    EXPECT_EQ(contents.files[i].checksum, xxh64(expected));
  }
  EXPECT_EQ(contents.skipped, 2u);  // fifo, dangling symlink
  EXPECT_EQ(sink.objects_completed_, 7u);

  const FileRecord* x = find_file(contents, "b_class/x.jpg");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->mode, 0600u);
  EXPECT_EQ(x->mtime_ns, 1'600'000'000'123'456'000);
  EXPECT_NE(find_directory(contents, "empty_dir"), nullptr);
  EXPECT_NE(find_directory(contents, "a_class/nested/deep"), nullptr);
  ASSERT_FALSE(contents.directories.empty());
  EXPECT_EQ(contents.directories.front().path, "");
  EXPECT_NE(find_directory(contents, "link_to_dir"), nullptr);
  // big.bin is 3 chunks of 4096.
  const auto big = find_file(contents, "big.bin");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(sink.pieces().count({big->object_id, true, 2}), 1u);
  EXPECT_EQ(sink.pieces().count({big->object_id, true, 3}), 0u);
}

// Modification times past 2262-04-11 do not fit int64 nanoseconds: they wrapped round (a file
// dated 2300 was served as 1715; found by an audit). Clamped now. (Before 1677 is clamped too;
// ext4 stores nothing before 1901, so a test here cannot make such a file.)
TEST(DirectorySource, ATimeBeyondWhatNanosecondsHoldIsClampedNotWrapped) {
  TempDir tmp;
  const fs::path root = tmp.path() / "src";
  write_file(root / "last.bin", "a");
  write_file(root / "later.bin", "b");
  const auto set_time = [&](const char* name, time_t seconds) {
    const timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, (root / name).c_str(), times, 0), 0) << std::strerror(errno);
  };
  set_time("last.bin", 9'223'372'036);    // 2262-04-11T23:47:16: fits
  set_time("later.bin", 10'413'792'000);  // 2300-01-01
  MemorySink sink;
  const SourceContents contents = make_directory_source(root, SourceOptions{})->read(sink);
  EXPECT_EQ(find_file(contents, "last.bin")->mtime_ns, 9'223'372'036'000'000'000);
  EXPECT_EQ(find_file(contents, "later.bin")->mtime_ns, std::numeric_limits<int64_t>::max());
}

// Between the walk and the reads, a file is swapped for a symlink to a file outside the tree, or
// a directory for a link to an outside one (someone who can write the tree, racing the ingest).
// With --symlinks inside or none nothing outside is ever read: the read finds another file than
// the walk did and the ingest fails, naming it. Before, the read reopened the path and followed
// the new link (an audit published a root-only file through a mount).
class SwapAfterWalkSink : public MemorySink {
 public:
  explicit SwapAfterWalkSink(std::function<void()> swap) : swap_(std::move(swap)) {}
  void expect_totals(uint64_t, uint64_t) override { swap_(); }

 private:
  std::function<void()> swap_;
};

TEST(DirectorySource, AFileSwappedForALinkOutsideAfterTheWalkIsNeverRead) {
  for (const SymlinkPolicy policy : {SymlinkPolicy::kInside, SymlinkPolicy::kNone}) {
    for (const bool swap_directory : {false, true}) {
      TempDir tmp;
      const fs::path root = tmp.path() / "tree";
      write_file(root / "c" / "img.jpg", "inside!");
      write_file(tmp.path() / "outside" / "img.jpg", "SECRET!");  // the same size
      SwapAfterWalkSink sink([&] {
        if (swap_directory) {
          fs::rename(root / "c", root / "c.old");
          fs::create_symlink(tmp.path() / "outside", root / "c");
        } else {
          fs::remove(root / "c" / "img.jpg");
          fs::create_symlink(tmp.path() / "outside" / "img.jpg", root / "c" / "img.jpg");
        }
      });
      SourceOptions options;
      options.symlinks = policy;
      try {
        make_directory_source(root, options)->read(sink);
        ADD_FAILURE() << "the swapped file was read (directory swapped: " << swap_directory << ")";
      } catch (const std::runtime_error& e) {
        EXPECT_THAT(e.what(), HasSubstr("was replaced while being ingested"));
        EXPECT_THAT(e.what(), HasSubstr("c/img.jpg"));
      }
      for (uint64_t id = 0; id < 2; ++id) EXPECT_NE(sink.object(id), "SECRET!");
    }
  }
}

TEST(DirectorySource, StopsWhenTheSinkAsksTo) {
  TempDir tmp;
  write_file(tmp.path() / "a" / "1", "one");
  MemorySink sink;
  sink.stop_ = true;
  auto source = make_directory_source(tmp.path(), SourceOptions{});
  EXPECT_THROW(source->read(sink), StopRequested);
}

// Root reads every directory, and CI runs as root: the walk runs in a child process that drops
// to nobody first (a death test), so the permission check really refuses the directory.
TEST(DirectorySource, UnreadableDirectoryIsAnErrorNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A "threadsafe" death test's child runs this body again from the top and leaves by _Exit:
  // it walks the parent's tree, named in the environment, instead of making one of its own
  // that nothing would remove.
  constexpr const char* kTreeVariable = "DSFS_TEST_UNREADABLE_TREE";
  std::optional<TempDir> tmp;
  fs::path tree;
  if (const char* parent_tree = std::getenv(kTreeVariable)) {
    tree = parent_tree;
  } else {
    tmp.emplace();
    tree = tmp->path();
    fs::create_directories(tree / "locked");
    ::chmod(tree.c_str(), 0755);  // nobody may reach the tree, just not into "locked"
    ::chmod((tree / "locked").c_str(), 0);
    ::setenv(kTreeVariable, tree.c_str(), 1);
  }
  const auto walk_as_nobody = [&] {
    constexpr uid_t kNobody = 65534;
    if (::geteuid() == 0 && (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)) {
      std::fprintf(stderr, "cannot drop root privileges\n");
      std::_Exit(2);
    }
    MemorySink sink;
    try {
      make_directory_source(tree, SourceOptions{})->read(sink);
      std::fprintf(stderr, "an unreadable directory was accepted\n");
      std::_Exit(1);
    } catch (const std::runtime_error& e) {
      std::fprintf(stderr, "refused: %s\n", e.what());
      std::_Exit(0);
    }
  };
  EXPECT_EXIT(walk_as_nobody(), testing::ExitedWithCode(0), "refused: .*locked.*Permission denied");
  ::unsetenv(kTreeVariable);
  ::chmod((tree / "locked").c_str(), 0755);
}

// ---- archive source --------------------------------------------------------------------------

struct ArchiveMember {
  std::string path;
  mode_t type;
  std::string content;  // regular files
  std::string link;     // hard links (to an earlier member) and symlinks
};

void write_archive(const fs::path& file, const std::vector<ArchiveMember>& members, bool gzip) {
  std::unique_ptr<archive, decltype(&archive_write_free)> writer(archive_write_new(),
                                                                 &archive_write_free);
  archive_write_set_format_pax(writer.get());  // pax headers keep sub-second mtimes
  if (gzip) archive_write_add_filter_gzip(writer.get());
  ASSERT_EQ(archive_write_open_filename(writer.get(), file.c_str()), ARCHIVE_OK);
  for (const auto& member : members) {
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                        &archive_entry_free);
    archive_entry_set_pathname(entry.get(), member.path.c_str());
    archive_entry_set_filetype(entry.get(), member.type);
    archive_entry_set_perm(entry.get(), member.type == AE_IFDIR ? 0755 : 0640);
    archive_entry_set_mtime(entry.get(), 1'500'000'000, 250);
    if (member.type == AE_IFREG && !member.link.empty()) {
      archive_entry_set_hardlink(entry.get(), member.link.c_str());
      archive_entry_set_size(entry.get(), 0);
    } else if (member.type == AE_IFLNK) {
      archive_entry_set_symlink(entry.get(), member.link.c_str());
    } else {
      archive_entry_set_size(entry.get(), static_cast<la_int64_t>(member.content.size()));
    }
    ASSERT_EQ(archive_write_header(writer.get(), entry.get()), ARCHIVE_OK)
        << archive_error_string(writer.get());
    if (member.type == AE_IFREG && member.link.empty() && !member.content.empty()) {
      ASSERT_EQ(archive_write_data(writer.get(), member.content.data(), member.content.size()),
                static_cast<la_ssize_t>(member.content.size()));
    }
  }
  ASSERT_EQ(archive_write_close(writer.get()), ARCHIVE_OK);
}

TEST(ArchiveSource, ReadsMembersHardLinksAndReplacementsFromACompressedTar) {
  TempDir tmp;
  const fs::path tar = tmp.path() / "data.tar.gz";
  const std::string big = pattern_bytes(5000, 9);
  write_archive(tar,
                {{"./", AE_IFDIR, "", ""},
                 {"./cls/", AE_IFDIR, "", ""},
                 {"./cls/a.jpg", AE_IFREG, "first version", ""},
                 {"./cls/big.bin", AE_IFREG, big, ""},
                 {"./other/empty", AE_IFREG, "", ""},
                 {"./cls/link.jpg", AE_IFREG, "", "./cls/big.bin"},
                 {"./cls/sym", AE_IFLNK, "", "a.jpg"},
                 {"./cls/a.jpg", AE_IFREG, "second version", ""},
                 {"./emptydir/", AE_IFDIR, "", ""}},
                /*gzip=*/true);
  SourceOptions options;
  options.chunk_size = 2048;
  auto source = make_archive_source(tar, options);
  EXPECT_EQ(source->kind(), SourceKind::kArchive);
  MemorySink sink;
  const SourceContents contents = source->read(sink);

  ASSERT_EQ(contents.files.size(), 4u);
  const FileRecord* a = find_file(contents, "cls/a.jpg");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(sink.object(a->object_id), "second version");
  EXPECT_EQ(a->checksum, xxh64("second version"));
  EXPECT_EQ(a->mode, 0640u);
  EXPECT_EQ(a->mtime_ns, 1'500'000'000'000'000'250);
  const FileRecord* big_file = find_file(contents, "cls/big.bin");
  const FileRecord* link = find_file(contents, "cls/link.jpg");
  ASSERT_NE(big_file, nullptr);
  ASSERT_NE(link, nullptr);
  EXPECT_EQ(sink.object(big_file->object_id), big);
  EXPECT_EQ(link->object_id, big_file->object_id);
  EXPECT_EQ(link->size, big.size());
  EXPECT_EQ(link->checksum, xxh64(big));
  const FileRecord* empty = find_file(contents, "other/empty");
  ASSERT_NE(empty, nullptr);
  EXPECT_EQ(empty->size, 0u);
  EXPECT_EQ(sink.object(empty->object_id), "");
  EXPECT_EQ(contents.skipped, 1u);  // the symlink
  EXPECT_NE(find_directory(contents, ""), nullptr);
  EXPECT_NE(find_directory(contents, "emptydir"), nullptr);

  // Labels come from the archive's first-level directories, implied ones included.
  EXPECT_THAT(image_folder_classes(contents), ElementsAre("cls", "emptydir", "other"));
}

TEST(ArchiveSource, MemberClimbingOutIsAnError) {
  TempDir tmp;
  const fs::path tar = tmp.path() / "evil.tar";
  write_archive(tar, {{"../outside.jpg", AE_IFREG, "x", ""}}, false);
  MemorySink sink;
  auto source = make_archive_source(tar, SourceOptions{});
  try {
    source->read(sink);
    FAIL() << "a member outside the dataset was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("evil.tar"));
  }
}

TEST(ArchiveSource, TruncatedArchiveIsAnErrorNamingIt) {
  TempDir tmp;
  const fs::path tar = tmp.path() / "cut.tar";
  write_archive(tar, {{"a.bin", AE_IFREG, pattern_bytes(100'000, 4), ""}}, false);
  fs::resize_file(tar, 50'000);
  MemorySink sink;
  auto source = make_archive_source(tar, SourceOptions{});
  try {
    source->read(sink);
    FAIL() << "a truncated archive was accepted";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cut.tar"));
  }
}

// Counts the bytes streamed to it and asks to stop once `limit` have come.
class StopAfterBytesSink : public SourceSink {
 public:
  explicit StopAfterBytesSink(uint64_t limit) : limit_(limit) {}
  void put_piece(const PieceKey&, std::string bytes, bool) override { bytes_ += bytes.size(); }
  bool stop_requested() const override { return bytes_ >= limit_; }
  uint64_t bytes() const { return bytes_; }

 private:
  uint64_t limit_;
  uint64_t bytes_ = 0;
};

TEST(ArchiveSource, AStopIsHonouredInsideASparseHole) {
  // A 4 GiB member with one 4 KiB block of data at its end: the hole before it reads as zeros.
  // Ctrl-C while those zeros streamed went unnoticed until the whole hole was hashed and stored.
  TempDir tmp;
  const fs::path tar = tmp.path() / "sparse.tar";
  constexpr la_int64_t kSize = la_int64_t{4} << 30;
  const std::string block(4096, 'x');
  {
    std::unique_ptr<archive, decltype(&archive_write_free)> writer(archive_write_new(),
                                                                   &archive_write_free);
    archive_write_set_format_pax(writer.get());
    ASSERT_EQ(archive_write_open_filename(writer.get(), tar.c_str()), ARCHIVE_OK);
    std::unique_ptr<archive_entry, decltype(&archive_entry_free)> entry(archive_entry_new(),
                                                                        &archive_entry_free);
    archive_entry_set_pathname(entry.get(), "hole.bin");
    archive_entry_set_filetype(entry.get(), AE_IFREG);
    archive_entry_set_perm(entry.get(), 0644);
    archive_entry_set_size(entry.get(), kSize);
    archive_entry_sparse_add_entry(entry.get(), kSize - 4096, 4096);
    ASSERT_EQ(archive_write_header(writer.get(), entry.get()), ARCHIVE_OK)
        << archive_error_string(writer.get());
    ASSERT_EQ(archive_write_data(writer.get(), block.data(), block.size()), 4096);
    ASSERT_EQ(archive_write_close(writer.get()), ARCHIVE_OK);
  }
  ASSERT_LT(fs::file_size(tar), 1u << 20);  // really sparse, not 4 GiB of zeros
  StopAfterBytesSink sink(1 << 20);
  auto source = make_archive_source(tar, SourceOptions{});
  EXPECT_THROW(source->read(sink), StopRequested);
  EXPECT_LT(sink.bytes(), uint64_t{64} << 20) << "streamed on after the stop was asked for";
}

// ---- options, progress -----------------------------------------------------------------------

TEST(ValidateIngestOptions, RejectsBadNamesAndRanges) {
  IngestOptions options;
  options.dataset = "ok-name_1.0";
  EXPECT_NO_THROW(validate_ingest_options(options));
  options.dataset = "bad name";
  EXPECT_THROW(validate_ingest_options(options), std::invalid_argument);
  options.dataset = "x";
  options.jobs = 0;
  EXPECT_THROW(validate_ingest_options(options), std::invalid_argument);
  options.jobs = 4;
  options.chunk_size = 0;
  EXPECT_THROW(validate_ingest_options(options), std::invalid_argument);
  options.chunk_size = kMaxChunkSize + 1;
  EXPECT_THROW(validate_ingest_options(options), std::invalid_argument);
}

TEST(ProgressFormat, ShowsKnownPartsOnly) {
  ProgressSnapshot s;
  s.files_done = 1234;
  s.files_total = 5000;
  s.bytes_done = 50'000'000;
  s.bytes_total = 200'000'000;
  s.seconds = 10;
  EXPECT_EQ(format_progress(s), "1,234/5,000 files  50.0/200.0 MB  5.0 MB/s  ETA 0:30");
  ProgressSnapshot unknown;
  unknown.files_done = 3;
  unknown.bytes_done = 1'500'000;
  unknown.seconds = 0.5;
  EXPECT_EQ(format_progress(unknown), "3 files  1.5 MB  3.0 MB/s");
  unknown.input_done = 25;
  unknown.input_total = 100;
  EXPECT_DOUBLE_EQ(estimate_seconds_left(unknown), 1.5);
  EXPECT_EQ(format_duration(3723), "1:02:03");
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(1'000'000), "1,000,000");
}

TEST(Progress, LinesStyleWritesPlainLinesAndCountsFromThreads) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  {
    ProgressOptions options;
    options.style = ProgressStyle::kLines;
    options.out = out;
    options.line_interval = std::chrono::milliseconds(10);
    Progress progress("ingest t", options);
    progress.set_totals(4, 0);
    std::thread a([&] { progress.add(2, 100); });
    std::thread b([&] { progress.add(2, 100); });
    a.join();
    b.join();
    EXPECT_EQ(progress.snapshot().files_done, 4u);
    EXPECT_EQ(progress.snapshot().bytes_done, 200u);
    // Wait (bounded) for at least one line, without asserting any timing.
    for (int i = 0; i < 500 && std::ftell(out) <= 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  std::rewind(out);
  char line[256] = {};
  ASSERT_NE(std::fgets(line, sizeof line, out), nullptr);
  EXPECT_THAT(line, HasSubstr("ingest t: "));
  EXPECT_THAT(line, HasSubstr("files"));
  EXPECT_EQ(std::string(line).find('\r'), std::string::npos);
  std::fclose(out);
}

}  // namespace
}  // namespace dsfs::tools
