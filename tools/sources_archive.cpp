// A tar (or any archive libarchive reads, compressed or not), streamed once in member order.
#include <archive.h>
#include <archive_entry.h>
#include <langinfo.h>
#include <locale.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "src/store/log_text.h"
#include "tools/sources.h"
#include "tools/sources_internal.h"

namespace dsfs::tools {
namespace {

constexpr size_t kArchiveBlockBytes = 1 << 20;
constexpr size_t kZeroBlockBytes = 64 * 1024;

int64_t entry_mtime_ns(archive_entry* entry) {
  if (!archive_entry_mtime_is_set(entry)) return 0;
  const char* path = archive_entry_pathname(entry);
  return detail::mtime_ns_from(archive_entry_mtime(entry), archive_entry_mtime_nsec(entry),
                               path ? path : "");
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

// The decompressed bytes of a compressed archive, every integrity check of its compression
// enforced to the end of the file: libarchive's tar reader stops at the end-of-archive blocks,
// before a compressed stream's trailer, and its gzip filter does not check the CRC or length at
// all, so a corrupt .tar.gz used to be ingested with wrong bytes. Not thread-safe.
class DecompressedBytes {
 public:
  virtual ~DecompressedBytes() = default;
  // The next piece of decompressed bytes, valid until the next call; empty at the end. Throws
  // std::runtime_error naming the archive when the compressed data is damaged or truncated.
  virtual std::string_view next() = 0;
  // Compressed bytes consumed so far (progress).
  virtual uint64_t compressed_position() const = 0;
  // Reads and checks whatever the archive reader left unread (end-of-archive padding, the
  // compression's trailer), so that an ingest ends only once the whole file has been checked.
  void finish() {
    while (!next().empty()) {
    }
  }
};

// gzip through zlib, which checks each member's CRC-32 and length. Concatenated members are
// read one after another (as gunzip does); anything after the last member but zero padding is
// an error.
class GzipBytes final : public DecompressedBytes {
 public:
  GzipBytes(const std::string& path, size_t block_bytes)
      : path_(path), file_(path, std::ios::binary), input_(block_bytes), output_(block_bytes) {
    if (!file_) throw error(std::strerror(errno));
    if (inflateInit2(&stream_, 16 + MAX_WBITS) != Z_OK) throw std::bad_alloc();
  }
  ~GzipBytes() override { inflateEnd(&stream_); }

  std::string_view next() override {
    for (;;) {
      if (done_) return {};
      if (stream_.avail_in == 0 && !refill()) {
        if (in_member_) throw error("the file ends inside a gzip member (truncated)");
        done_ = true;
        return {};
      }
      if (!in_member_) {
        // Between members: another member, or zero padding to the end of the file.
        if (static_cast<unsigned char>(stream_.next_in[0]) == 0) {
          skip_zero_padding();
          continue;
        }
        if (inflateReset(&stream_) != Z_OK) throw error("zlib cannot start the next member");
        in_member_ = true;
      }
      stream_.next_out = reinterpret_cast<Bytef*>(output_.data());
      stream_.avail_out = static_cast<uInt>(output_.size());
      const int status = inflate(&stream_, Z_NO_FLUSH);
      if (status == Z_STREAM_END) {
        in_member_ = false;  // CRC-32 and length checked by zlib
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        throw error(fmt::format("the gzip data is damaged ({})",
                                stream_.msg ? stream_.msg : zError(status)));
      }
      const size_t produced = output_.size() - stream_.avail_out;
      if (produced > 0) return {output_.data(), produced};
    }
  }

  uint64_t compressed_position() const override { return consumed_ - stream_.avail_in; }

 private:
  bool refill() {
    file_.read(input_.data(), static_cast<std::streamsize>(input_.size()));
    if (file_.bad()) throw error(std::strerror(errno));
    const auto count = static_cast<size_t>(file_.gcount());
    consumed_ += count;
    stream_.next_in = reinterpret_cast<Bytef*>(input_.data());
    stream_.avail_in = static_cast<uInt>(count);
    return count > 0;
  }

  void skip_zero_padding() {
    while (stream_.avail_in > 0) {
      if (*stream_.next_in != 0) {
        throw error("there are bytes after the last gzip member that are not a gzip member");
      }
      ++stream_.next_in;
      --stream_.avail_in;
    }
  }

  std::runtime_error error(std::string_view why) const {
    return std::runtime_error(fmt::format("archive '{}' is damaged: {} (check it with `gzip -t`)",
                                          store::log_text(path_), why));
  }

  std::string path_;
  std::ifstream file_;
  std::vector<char> input_;
  std::vector<char> output_;
  z_stream stream_{};
  uint64_t consumed_ = 0;
  bool in_member_ = true;
  bool done_ = false;
};

// Any other compression libarchive decodes (bzip2, xz, lzma, zstd, lz4, ...), read as one raw
// stream to its end, so the filter's own checks (bzip2 CRCs, xz and zstd checksums) all run.
class LibarchiveFilterBytes final : public DecompressedBytes {
 public:
  LibarchiveFilterBytes(const std::string& path, size_t block_bytes)
      : path_(path), reader_(archive_read_new(), &archive_read_free), output_(block_bytes) {
    if (!reader_) throw std::bad_alloc();
    detail::enable_archive_filters(reader_.get());
    archive_read_support_format_raw(reader_.get());
    archive_entry* entry = nullptr;
    if (archive_read_open_filename(reader_.get(), path.c_str(), block_bytes) != ARCHIVE_OK ||
        archive_read_next_header(reader_.get(), &entry) != ARCHIVE_OK) {
      throw error();
    }
    filter_name_ = archive_filter_name(reader_.get(), 0);
  }

  std::string_view next() override {
    if (done_) return {};
    const la_ssize_t count = archive_read_data(reader_.get(), output_.data(), output_.size());
    // A warning here is damage too: fail closed.
    if (count < 0 || archive_errno(reader_.get()) != 0) throw error();
    if (count == 0) done_ = true;
    return {output_.data(), static_cast<size_t>(count)};
  }

  uint64_t compressed_position() const override {
    return static_cast<uint64_t>(archive_filter_bytes(reader_.get(), -1));
  }

 private:
  std::runtime_error error() const {
    const char* reason = archive_error_string(reader_.get());
    return std::runtime_error(fmt::format(
        "archive '{}' is damaged: its {} data does not decode ({})", store::log_text(path_),
        filter_name_, reason ? reason : "truncated or corrupt"));
  }

  std::string path_;
  std::unique_ptr<archive, decltype(&archive_read_free)> reader_;
  std::vector<char> output_;
  std::string filter_name_ = "compressed";
  bool done_ = false;
};

// The decompressor `path` needs, or nullptr when it is not compressed (then libarchive reads
// the file itself and may seek, which zip, 7-Zip and ISO images need).
std::unique_ptr<DecompressedBytes> open_decompressed(const std::string& path, size_t block_bytes) {
  std::array<unsigned char, 2> magic{};
  {
    std::ifstream file(path, std::ios::binary);
    file.read(reinterpret_cast<char*>(magic.data()), magic.size());
  }
  if (magic[0] == 0x1f && magic[1] == 0x8b) return std::make_unique<GzipBytes>(path, block_bytes);
  std::unique_ptr<archive, decltype(&archive_read_free)> probe(archive_read_new(),
                                                               &archive_read_free);
  if (!probe) throw std::bad_alloc();
  detail::enable_archive_filters(probe.get());
  archive_read_support_format_raw(probe.get());
  archive_entry* entry = nullptr;
  if (archive_read_open_filename(probe.get(), path.c_str(), 64 * 1024) == ARCHIVE_OK &&
      archive_read_next_header(probe.get(), &entry) == ARCHIVE_OK &&
      archive_filter_count(probe.get()) > 1) {
    return std::make_unique<LibarchiveFilterBytes>(path, block_bytes);
  }
  return nullptr;
}

// libarchive's read callback over DecompressedBytes; errors travel as exceptions through the
// C library would be undefined, so they are kept here and rethrown by the caller.
struct DecompressedReader {
  DecompressedBytes* bytes = nullptr;
  std::exception_ptr error;

  static la_ssize_t read(archive* reader, void* self, const void** buffer) {
    auto& state = *static_cast<DecompressedReader*>(self);
    try {
      const std::string_view piece = state.bytes->next();
      *buffer = piece.data();
      return static_cast<la_ssize_t>(piece.size());
    } catch (...) {
      state.error = std::current_exception();
      archive_set_error(reader, EIO, "the compressed data is damaged");
      return -1;
    }
  }
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
    detail::enable_archive_formats(reader.get());
    const std::unique_ptr<DecompressedBytes> decompressed =
        open_decompressed(description(), kArchiveBlockBytes);
    reader_state_.bytes = decompressed.get();
    const int opened = decompressed ? archive_read_open(reader.get(), &reader_state_, nullptr,
                                                        &DecompressedReader::read, nullptr)
                                    : archive_read_open_filename(
                                          reader.get(), description().c_str(), kArchiveBlockBytes);
    if (opened != ARCHIVE_OK) fail(reader.get(), "cannot open");
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
      // Any warning means the archive is not what its writer wrote (a bad header checksum, a
      // truncated member): fail closed. Name conversion no longer warns (UTF-8 LC_CTYPE above).
      if (status != ARCHIVE_OK) fail(reader.get(), "cannot read");
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
        sink.input_position(decompressed
                                ? decompressed->compressed_position()
                                : static_cast<uint64_t>(archive_filter_bytes(reader.get(), -1)),
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
    if (decompressed) decompressed->finish();  // the trailer and every checksum up to the end
    return contents;
  }

 private:
  [[noreturn]] void fail(archive* reader, std::string_view what) const {
    if (reader_state_.error) std::rethrow_exception(reader_state_.error);
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
    // Sparse members leave holes between blocks; they read as zeros. A hole may be terabytes
    // declared in a few header bytes, so a stop is honoured inside it too.
    auto fill_zeros_to = [&](uint64_t offset) {
      while (written < offset) {
        sink.check_stop();
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
      // A warning while reading data is damage (a zip member's CRC, a short member): fail.
      if (status != ARCHIVE_OK) {
        fail(reader, fmt::format("cannot read member '{}' of", store::log_text(path)));
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
  DecompressedReader reader_state_;
};

}  // namespace

void detail::enable_archive_filters(archive* reader) {
  archive_read_support_filter_gzip(reader);
  archive_read_support_filter_bzip2(reader);
  archive_read_support_filter_xz(reader);
  archive_read_support_filter_lzma(reader);
  archive_read_support_filter_lzip(reader);
  archive_read_support_filter_zstd(reader);
  archive_read_support_filter_lz4(reader);
  archive_read_support_filter_compress(reader);
}

void detail::enable_archive_formats(archive* reader) {
  archive_read_support_format_tar(reader);  // ustar, pax, GNU, v7
  archive_read_support_format_cpio(reader);
  archive_read_support_format_zip(reader);
  archive_read_support_format_7zip(reader);
  archive_read_support_format_iso9660(reader);
  archive_read_support_format_ar(reader);
  archive_read_support_format_xar(reader);
  archive_read_support_format_cab(reader);
  archive_read_support_format_lha(reader);
  archive_read_support_format_rar(reader);
  archive_read_support_format_rar5(reader);
}

std::unique_ptr<Source> make_archive_source(const std::filesystem::path& archive,
                                            const SourceOptions& options) {
  return std::make_unique<ArchiveSource>(archive, options);
}

}  // namespace dsfs::tools
