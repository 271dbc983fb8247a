#pragma once
// What `dsfs ingest` reads from: a directory tree, a tar archive (any format and compression
// libarchive knows), or a text file listing http(s) URLs. A source streams every file through an
// ObjectStream into a SourceSink and reports the tree it read.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "src/catalog/catalog.h"
#include "tools/ingest_object.h"

namespace dsfs::tools {

enum class SourceKind { kDirectory, kArchive, kUrlList };
std::string_view to_string(SourceKind kind);

// Directory -> kDirectory; a file named like an archive (.tar, .tar.gz, .tgz, .tar.zst, ...) or
// whose content libarchive recognises -> kArchive; a text file whose non-comment lines all start
// with http:// or https:// -> kUrlList. Throws std::runtime_error naming the path otherwise
// (missing, unreadable, special file, unrecognised content).
SourceKind detect_source_kind(const std::filesystem::path& source);

bool has_archive_extension(std::string_view file_name);
// True when `text` has at least one URL line and every line that is not blank or a `#` comment
// starts with http:// or https://.
bool looks_like_url_list(std::string_view text);

struct UrlListEntry {
  std::string url;
  std::string relative_path;
  size_t line = 0;  // 1-based line in the list
};
// One URL per line, optionally followed by whitespace and the relative path to store it under;
// blank lines and `#` comments are ignored. Throws std::invalid_argument naming list:line for a
// line that is not an http(s) URL, a bad relative path, or a path listed twice.
std::vector<UrlListEntry> parse_url_list(std::string_view text, std::string_view list_name);
// The URL's path without the leading '/', percent-decoded ("http://h/a/b%20c.jpg" -> "a/b c.jpg").
// Throws std::invalid_argument when the URL is malformed or has no file path.
std::string url_to_relative_path(std::string_view url);

// A URL of a list for a message: a password in it (https://user:PASSWORD@host/...) and its query
// (a presigned URL's signature) shown as ***, the rest escaped (store::log_text).
std::string url_for_messages(std::string_view url);
// Canonical relative path of an archive member or list entry: strips leading "/" and "./",
// collapses "//" and drops "." components and a trailing '/'. Throws std::invalid_argument
// naming `context` for ".." or a component that catalog::is_valid_path_component rejects.
// Returns "" for the root itself.
std::string normalize_relative_path(std::string_view path, std::string_view context);

struct DirectoryRecord {
  std::string path;  // relative, '/'-separated; "" is the root
  int64_t mtime_ns = 0;
  uint32_t mode = 0755;
};

struct FileRecord {
  std::string path;  // relative, '/'-separated
  uint64_t object_id = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0644;
  uint64_t checksum = 0;
};

// Everything a source read. Files are in object-id order unless a tar member replaced an earlier
// one of the same path; several files may share an object id (tar hard links).
struct SourceContents {
  std::vector<DirectoryRecord> directories;  // the root ("") first when the source has one
  std::vector<FileRecord> files;
  uint64_t skipped = 0;  // special files, symlink loops, unfollowed symlinked directories
};

// Which symlinks a directory source follows. kAll is torchvision's ImageFolder (os.walk with
// followlinks=True, and open() follows file links); a link whose target lies outside the source
// tree is followed with a warning naming it and its target. kInside refuses such a link (the
// ingest fails, naming it): nothing outside the tree an operator named is ever read. kNone
// skips every symlink, to files and directories alike, with a warning.
enum class SymlinkPolicy { kAll, kInside, kNone };
// "all", "inside", "none"; throws std::invalid_argument otherwise.
SymlinkPolicy parse_symlink_policy(std::string_view text);

struct SourceOptions {
  unsigned parallelism = 4;  // reader threads (directory) or concurrent transfers (URLs)
  // Directories: which symlinks are followed (loops are skipped with a warning).
  SymlinkPolicy symlinks = SymlinkPolicy::kAll;
  uint64_t chunk_size = 4ull << 20;
  catalog::ChecksumKind checksum = catalog::ChecksumKind::kXxh64;
  // URL lists: tries per URL on transient failures, and limits that keep a stalled or trickling
  // server from hanging the ingest: a transfer averaging under url_min_bytes_per_second over
  // url_stall_timeout is abandoned (and retried), and each file, all its tries together, must
  // be fetched within url_file_deadline.
  unsigned url_attempts = 4;
  std::chrono::milliseconds url_connect_timeout{10000};
  std::chrono::milliseconds url_stall_timeout{30000};
  uint64_t url_min_bytes_per_second = 1024;
  std::chrono::milliseconds url_file_deadline{30 * 60 * 1000};
  std::chrono::milliseconds url_retry_backoff{250};
};

class Source {
 public:
  virtual ~Source() = default;
  SourceKind kind() const { return kind_; }
  // What was ingested, for the dataset's info (absolute path of the directory, archive or list).
  const std::string& description() const { return description_; }
  // Streams every file into `sink`. Throws std::runtime_error naming the file that could not be
  // read, or StopRequested when the sink asks to stop.
  virtual SourceContents read(SourceSink& sink) = 0;

 protected:
  Source(SourceKind kind, std::string description)
      : kind_(kind), description_(std::move(description)) {}

 private:
  SourceKind kind_;
  std::string description_;
};

// Detects the kind of `source` and opens it (a URL list is parsed here, so a malformed list fails
// before anything is written).
std::unique_ptr<Source> open_source(const std::filesystem::path& source,
                                    const SourceOptions& options);

std::unique_ptr<Source> make_directory_source(const std::filesystem::path& root,
                                              const SourceOptions& options);
std::unique_ptr<Source> make_archive_source(const std::filesystem::path& archive,
                                            const SourceOptions& options);
std::unique_ptr<Source> make_url_list_source(std::string description,
                                             std::vector<UrlListEntry> entries,
                                             const SourceOptions& options);

}  // namespace dsfs::tools
