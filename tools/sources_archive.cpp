// A tar (or any archive libarchive reads, compressed or not), streamed once in member order.
#include <archive.h>
#include <archive_entry.h>
#include <langinfo.h>
#include <locale.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "tools/sources.h"

namespace dsfs::tools {
namespace {

constexpr size_t kArchiveBlockBytes = 1 << 20;
constexpr size_t kZeroBlockBytes = 64 * 1024;

int64_t entry_mtime_ns(archive_entry* entry) {
  if (!archive_entry_mtime_is_set(entry)) return 0;
  return static_cast<int64_t>(archive_entry_mtime(entry)) * 1'000'000'000 +
         archive_entry_mtime_nsec(entry);
}

// Makes this thread's LC_CTYPE UTF-8 while it lives (unless it already is). libarchive converts
// pax names (UTF-8 by the standard) to the locale's charset; in the C locale every non-ASCII
// name fails that conversion and warns twice per member, although the bytes it keeps are right.
class Utf8CtypeForThisThread {
 public:
  Utf8CtypeForThisThread() {
    if (std::string_view(::nl_langinfo(CODESET)) == "UTF-8") return;
    utf8_ = ::newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    if (utf8_ != static_cast<locale_t>(0)) previous_ = ::uselocale(utf8_);
  }
  ~Utf8CtypeForThisThread() {
    if (utf8_ == static_cast<locale_t>(0)) return;
    ::uselocale(previous_);
    ::freelocale(utf8_);
  }
  Utf8CtypeForThisThread(const Utf8CtypeForThisThread&) = delete;
  Utf8CtypeForThisThread& operator=(const Utf8CtypeForThisThread&) = delete;

 private:
  locale_t utf8_ = static_cast<locale_t>(0);
  locale_t previous_ = static_cast<locale_t>(0);
};

class ArchiveSource final : public Source {
 public:
  ArchiveSource(const std::filesystem::path& path, const SourceOptions& options)
      : Source(SourceKind::kArchive, std::filesystem::absolute(path).lexically_normal().string()),
        options_(options) {}

  SourceContents read(SourceSink& sink) override {
    const Utf8CtypeForThisThread utf8_names;  // before libarchive looks up the charset
    std::unique_ptr<archive, decltype(&archive_read_free)> reader(archive_read_new(),
                                                                  &archive_read_free);
    if (!reader) throw std::bad_alloc();
    archive_read_support_filter_all(reader.get());
    archive_read_support_format_all(reader.get());
    if (archive_read_open_filename(reader.get(), description().c_str(), kArchiveBlockBytes) !=
        ARCHIVE_OK) {
      fail(reader.get(), "cannot open");
    }
    std::error_code size_error;
    const auto archive_size = std::filesystem::file_size(description(), size_error);
    sink.expect_totals(0, 0);

    SourceContents contents;
    // Index into contents.files / contents.directories by path: a later member of the same
    // path replaces the earlier one (as tar extraction does), and hard links find their target.
    std::unordered_map<std::string, size_t> file_index;
    std::unordered_map<std::string, size_t> directory_index;
    uint64_t next_object_id = 0;
    const std::string member_context = fmt::format("archive '{}'", description());

    for (;;) {
      sink.check_stop();
      archive_entry* entry = nullptr;
      const int status = archive_read_next_header(reader.get(), &entry);
      if (status == ARCHIVE_EOF) break;
      if (status == ARCHIVE_WARN) {
        spdlog::warn("archive '{}': {}", description(), archive_error_string(reader.get()));
      } else if (status != ARCHIVE_OK) {
        fail(reader.get(), "cannot read");
      }
      const char* raw_name = archive_entry_pathname(entry);
      if (!raw_name) {
        throw std::runtime_error(
            fmt::format("archive '{}' has a member without a path name", description()));
      }
      const std::string path = normalize_relative_path(raw_name, member_context);
      const auto type = archive_entry_filetype(entry);
      const uint32_t mode = archive_entry_perm(entry) & 07777u;

      if (type == AE_IFDIR) {
        DirectoryRecord record{path, entry_mtime_ns(entry), mode};
        if (const auto it = directory_index.find(path); it != directory_index.end()) {
          contents.directories[it->second] = std::move(record);
        } else {
          directory_index.emplace(path, contents.directories.size());
          contents.directories.push_back(std::move(record));
        }
        continue;
      }
      if (path.empty()) {
        throw std::runtime_error(fmt::format("archive '{}' has a non-directory member named '{}'",
                                             description(), raw_name));
      }

      FileRecord record;
      record.path = path;
      record.mtime_ns = entry_mtime_ns(entry);
      record.mode = mode;
      if (const char* link_target = archive_entry_hardlink(entry)) {
        // A hard link's data is its target's: share the target's object.
        const std::string target = normalize_relative_path(link_target, member_context);
        const auto it = file_index.find(target);
        if (it == file_index.end()) {
          spdlog::warn(
              "skipping '{}' in archive '{}': hard link to '{}', which is not an earlier "
              "regular file",
              path, description(), target);
          ++contents.skipped;
          continue;
        }
        const FileRecord& original = contents.files[it->second];
        record.object_id = original.object_id;
        record.size = original.size;
        record.checksum = original.checksum;
      } else if (type == AE_IFREG) {
        record.object_id = next_object_id++;
        const FileDigest digest = read_member(reader.get(), entry, path, record.object_id, sink);
        record.size = digest.size;
        record.checksum = digest.checksum;
      } else {
        spdlog::warn("skipping '{}' in archive '{}': {}", path, description(),
                     type == AE_IFLNK ? "symlink" : "special file");
        ++contents.skipped;
        continue;
      }
      if (!size_error) {
        sink.input_position(static_cast<uint64_t>(archive_filter_bytes(reader.get(), -1)),
                            archive_size);
      }
      if (const auto it = file_index.find(path); it != file_index.end()) {
        spdlog::warn("'{}' appears more than once in archive '{}'; the last one wins", path,
                     description());
        contents.files[it->second] = std::move(record);
      } else {
        file_index.emplace(path, contents.files.size());
        contents.files.push_back(std::move(record));
      }
    }
    return contents;
  }

 private:
  [[noreturn]] void fail(archive* reader, std::string_view what) const {
    const char* reason = archive_error_string(reader);
    throw std::runtime_error(fmt::format("{} archive '{}': {}", what, description(),
                                         reason ? reason : "unknown libarchive error"));
  }

  FileDigest read_member(archive* reader, archive_entry* entry, const std::string& path,
                         uint64_t object_id, SourceSink& sink) const {
    const bool size_known = archive_entry_size_is_set(entry);
    const uint64_t declared_size =
        size_known ? static_cast<uint64_t>(std::max<la_int64_t>(archive_entry_size(entry), 0)) : 0;
    ObjectStream stream(sink, object_id, options_.chunk_size, options_.checksum, declared_size);
    uint64_t written = 0;
    const std::string zeros(kZeroBlockBytes, '\0');
    // Sparse members leave holes between blocks; they read as zeros.
    auto fill_zeros_to = [&](uint64_t offset) {
      while (written < offset) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(offset - written, zeros.size()));
        stream.append(std::string_view(zeros.data(), n));
        written += n;
      }
    };
    for (;;) {
      const void* block = nullptr;
      size_t block_size = 0;
      la_int64_t offset = 0;
      const int status = archive_read_data_block(reader, &block, &block_size, &offset);
      if (status == ARCHIVE_EOF) break;
      if (status == ARCHIVE_WARN) {
        spdlog::warn("archive '{}', member '{}': {}", description(), path,
                     archive_error_string(reader));
      } else if (status != ARCHIVE_OK) {
        fail(reader, fmt::format("cannot read member '{}' of", path));
      }
      sink.check_stop();
      fill_zeros_to(static_cast<uint64_t>(offset));
      stream.append(std::string_view(static_cast<const char*>(block), block_size));
      written += block_size;
    }
    if (size_known) fill_zeros_to(declared_size);
    return stream.finish();
  }

  SourceOptions options_;
};

}  // namespace

std::unique_ptr<Source> make_archive_source(const std::filesystem::path& archive,
                                            const SourceOptions& options) {
  return std::make_unique<ArchiveSource>(archive, options);
}

}  // namespace dsfs::tools
