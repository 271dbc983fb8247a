#pragma once
// Temporary directories and small file helpers shared by the unit tests.
#include <cstddef>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>

namespace dsfs::test {

// A fresh directory under the system temp dir, removed with everything in it on destruction
// (also when the test that owns it fails).
class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "dsfs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// The whole file as bytes; throws std::runtime_error if it cannot be opened.
std::string read_file(const std::filesystem::path& path);

// Writes `content` to `path`, creating missing parent directories; a failed write is a test
// failure naming the path.
void write_file(const std::filesystem::path& path, std::string_view content);

// `size` deterministic pseudo-random bytes: the same seed always gives the same bytes.
std::string pattern_bytes(size_t size, unsigned seed);

// read(2) of the whole file (into `content` when given); the errno of the first failure
// (open or read), 0 on success. For checking what a mount answers, EIO included.
int read_errno(const std::filesystem::path& path, std::string* content = nullptr);

// The names in directory `dir` (no "." or "..").
std::set<std::string> list_dir(const std::filesystem::path& dir);

}  // namespace dsfs::test
