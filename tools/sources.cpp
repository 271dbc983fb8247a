// Source-kind detection, URL-list parsing and path normalisation shared by every source.
#include "tools/sources.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <unordered_map>

#include "src/catalog/names.h"
#include "src/store/log_text.h"
#include "tools/sources_internal.h"

namespace dsfs::tools {
namespace {

constexpr size_t kDetectPrefixBytes = 1 << 20;

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n\v\f");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n\v\f");
  return text.substr(first, last - first + 1);
}

bool starts_with_http_scheme(std::string_view line) {
  auto has_prefix = [&](std::string_view prefix) {
    return line.size() >= prefix.size() &&
           std::equal(prefix.begin(), prefix.end(), line.begin(), [](char a, char b) {
             return a == std::tolower(static_cast<unsigned char>(b));
           });
  };
  return has_prefix("http://") || has_prefix("https://");
}

// Calls fn(line_number, trimmed_line) for every line that is not blank or a comment.
template <typename Fn>
void for_each_content_line(std::string_view text, Fn&& fn) {
  size_t line_number = 0;
  while (!text.empty()) {
    const auto end = text.find('\n');
    const std::string_view raw = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    ++line_number;
    const std::string_view line = trim(raw);
    if (line.empty() || line.front() == '#') continue;
    fn(line_number, line);
  }
}

std::string read_prefix(const std::filesystem::path& file, size_t max_bytes, bool* complete) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error(
        fmt::format("cannot read source '{}': {}", file.string(), std::strerror(errno)));
  }
  std::string bytes(max_bytes + 1, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (in.bad()) {
    throw std::runtime_error(fmt::format("cannot read source '{}': read error", file.string()));
  }
  bytes.resize(static_cast<size_t>(in.gcount()));
  *complete = bytes.size() <= max_bytes;
  if (!*complete) bytes.resize(max_bytes);
  return bytes;
}

std::string read_whole_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error(
        fmt::format("cannot read URL list '{}': {}", file.string(), std::strerror(errno)));
  }
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) {
    throw std::runtime_error(fmt::format("cannot read URL list '{}': read error", file.string()));
  }
  return std::move(content).str();
}

// True when libarchive recognises the file as an archive (of any format it knows, compressed or
// not), including an empty tar; an empty file does not count.
bool libarchive_recognises(const std::filesystem::path& file) {
  std::unique_ptr<archive, decltype(&archive_read_free)> reader(archive_read_new(),
                                                                &archive_read_free);
  if (!reader) throw std::bad_alloc();
  detail::enable_archive_filters(reader.get());
  detail::enable_archive_formats(reader.get());
  if (archive_read_open_filename(reader.get(), file.c_str(), 64 * 1024) != ARCHIVE_OK) {
    return false;
  }
  archive_entry* entry = nullptr;
  const int status = archive_read_next_header(reader.get(), &entry);
  if (status == ARCHIVE_OK || status == ARCHIVE_WARN) return true;
  return status == ARCHIVE_EOF && archive_format(reader.get()) != ARCHIVE_FORMAT_EMPTY;
}

}  // namespace

int64_t detail::mtime_ns_from(int64_t seconds, int64_t nanoseconds, std::string_view path) {
  constexpr int64_t kBillion = 1'000'000'000;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  int64_t scaled = 0;
  int64_t total = 0;
  if (!__builtin_mul_overflow(seconds, kBillion, &scaled) &&
      !__builtin_add_overflow(scaled, nanoseconds, &total)) {
    return total;
  }
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) {
    spdlog::warn(
        "{}: its modification time ({} s since 1970) is outside what dsfs stores (1677-09-21 to "
        "2262-04-11); stored as the nearest of those (and so for any other such file)",
        store::log_text(path), seconds);
  }
  return seconds < 0 ? kMin : kMax;
}

void detail::ensure_curl_initialised() {
  static const CURLcode status = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (status != CURLE_OK) {
    throw std::runtime_error(
        fmt::format("cannot initialise libcurl: {}", curl_easy_strerror(status)));
  }
}

std::string_view to_string(SourceKind kind) {
  switch (kind) {
    case SourceKind::kDirectory:
      return "directory";
    case SourceKind::kArchive:
      return "archive";
    case SourceKind::kUrlList:
      return "URL list";
  }
  return "unknown";
}

bool has_archive_extension(std::string_view file_name) {
  std::string lower(file_name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static constexpr std::array kSuffixes = {".tar",     ".tar.gz", ".tgz",      ".tar.bz2", ".tbz2",
                                           ".tbz",     ".tar.xz", ".txz",      ".tar.zst", ".tzst",
                                           ".tar.lz4", ".tar.lz", ".tar.lzma", ".tlz",     ".cpio",
                                           ".zip",     ".7z",     ".iso",      ".pax",     ".ar"};
  return std::any_of(kSuffixes.begin(), kSuffixes.end(),
                     [&](std::string_view suffix) { return lower.ends_with(suffix); });
}

SymlinkPolicy parse_symlink_policy(std::string_view text) {
  if (text == "all") return SymlinkPolicy::kAll;
  if (text == "inside") return SymlinkPolicy::kInside;
  if (text == "none") return SymlinkPolicy::kNone;
  throw std::invalid_argument(
      fmt::format("--symlinks must be all, inside or none, not '{}'", store::log_text(text)));
}

bool looks_like_url_list(std::string_view text) {
  if (text.find('\0') != std::string_view::npos) return false;
  bool any_url = false;
  bool all_urls = true;
  for_each_content_line(text, [&](size_t, std::string_view line) {
    if (starts_with_http_scheme(line)) {
      any_url = true;
    } else {
      all_urls = false;
    }
  });
  return any_url && all_urls;
}

SourceKind detect_source_kind(const std::filesystem::path& source) {
  std::error_code error;
  const auto status = std::filesystem::status(source, error);
  if (error || !std::filesystem::exists(status)) {
    if (error && error != std::errc::no_such_file_or_directory) {
      throw std::runtime_error(fmt::format("cannot access source '{}': {}",
                                           store::log_text(source.string()), error.message()));
    }
    throw std::runtime_error(
        fmt::format("source '{}' does not exist; give a directory, a tar archive or a file of URLs",
                    store::log_text(source.string())));
  }
  if (std::filesystem::is_directory(status)) return SourceKind::kDirectory;
  if (!std::filesystem::is_regular_file(status)) {
    throw std::runtime_error(fmt::format(
        "source '{}' is a special file; give a directory, a tar archive or a file of URLs",
        store::log_text(source.string())));
  }
  if (has_archive_extension(source.filename().string())) return SourceKind::kArchive;

  bool complete = false;
  std::string prefix = read_prefix(source, kDetectPrefixBytes, &complete);
  // A prefix may end mid-line; judge only whole lines.
  if (!complete) prefix.resize(prefix.rfind('\n') == std::string::npos ? 0 : prefix.rfind('\n'));
  if (looks_like_url_list(prefix)) return SourceKind::kUrlList;
  if (libarchive_recognises(source)) return SourceKind::kArchive;
  // Text that is not a URL list is a list with a bad line (file://, ftp://, a typo): name it.
  if (prefix.find('\0') == std::string::npos) {
    std::optional<std::pair<size_t, std::string_view>> first_bad;
    for_each_content_line(prefix, [&](size_t line_number, std::string_view line) {
      if (!first_bad && !starts_with_http_scheme(line)) first_bad.emplace(line_number, line);
    });
    if (first_bad) {
      throw std::runtime_error(fmt::format(
          "source '{}' is not an archive, and as a URL list its line {} is not an http(s) URL: "
          "'{}'; a URL list holds one http:// or https:// URL per line ('#' comments allowed)",
          store::log_text(source.string()), first_bad->first,
          store::log_text(first_bad->second, 120)));
    }
  }
  throw std::runtime_error(fmt::format(
      "source '{}' is neither a directory, an archive libarchive can read, nor a list of "
      "http(s) URLs (one per line, '#' comments allowed)",
      store::log_text(source.string())));
}

std::string normalize_relative_path(std::string_view path, std::string_view context) {
  std::string normalized;
  std::string_view rest = path;
  while (!rest.empty()) {
    const auto slash = rest.find('/');
    const std::string_view component = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
    if (component.empty() || component == ".") continue;
    if (component == "..") {
      throw std::invalid_argument(fmt::format("{}: path '{}' climbs out of the dataset with '..'",
                                              context, store::log_text(path)));
    }
    if (!catalog::is_valid_path_component(component)) {
      throw std::invalid_argument(
          fmt::format("{}: path '{}' has an invalid component '{}' (1-255 bytes, no NUL)", context,
                      path, component));
    }
    if (!normalized.empty()) normalized += '/';
    normalized += component;
  }
  return normalized;
}

std::string url_for_messages(std::string_view url) {
  detail::ensure_curl_initialised();
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> handle(curl_url(), &curl_url_cleanup);
  const std::string whole(url);
  char* shown = nullptr;
  if (handle && curl_url_set(handle.get(), CURLUPART_URL, whole.c_str(), 0) == CURLUE_OK) {
    char* part = nullptr;
    if (curl_url_get(handle.get(), CURLUPART_PASSWORD, &part, 0) == CURLUE_OK) {
      curl_free(part);
      curl_url_set(handle.get(), CURLUPART_PASSWORD, "***", 0);
    }
    if (curl_url_get(handle.get(), CURLUPART_QUERY, &part, 0) == CURLUE_OK) {
      curl_free(part);
      curl_url_set(handle.get(), CURLUPART_QUERY, "***", 0);
    }
    if (curl_url_get(handle.get(), CURLUPART_URL, &shown, 0) != CURLUE_OK) shown = nullptr;
  }
  if (shown == nullptr) {
    // Not a URL curl parses: everything from the scheme's "//" to the last '@' could be a secret,
    // and so could any query.
    std::string text = whole.substr(0, whole.find('?'));
    const size_t slashes = text.find("//");
    const size_t at = text.rfind('@');
    if (at != std::string::npos) {
      const size_t begin = slashes == std::string::npos ? 0 : slashes + 2;
      if (at >= begin) text.replace(begin, at - begin, "***");
    }
    return store::log_text(text);
  }
  const std::unique_ptr<char, decltype(&curl_free)> owned(shown, &curl_free);
  return store::log_text(owned.get());
}

std::string url_to_relative_path(std::string_view url) {
  detail::ensure_curl_initialised();
  std::unique_ptr<CURLU, decltype(&curl_url_cleanup)> handle(curl_url(), &curl_url_cleanup);
  if (!handle) throw std::bad_alloc();
  const std::string url_text(url);
  if (const CURLUcode status = curl_url_set(handle.get(), CURLUPART_URL, url_text.c_str(), 0);
      status != CURLUE_OK) {
    throw std::invalid_argument(
        fmt::format("malformed URL '{}': {}", url_for_messages(url), curl_url_strerror(status)));
  }
  char* raw_path = nullptr;
  if (const CURLUcode status =
          curl_url_get(handle.get(), CURLUPART_PATH, &raw_path, CURLU_URLDECODE);
      status != CURLUE_OK) {
    throw std::invalid_argument(fmt::format("cannot decode the path of URL '{}': {}",
                                            url_for_messages(url), curl_url_strerror(status)));
  }
  const std::unique_ptr<char, decltype(&curl_free)> path(raw_path, &curl_free);
  std::string relative =
      normalize_relative_path(path.get(), fmt::format("URL '{}'", url_for_messages(url)));
  if (relative.empty()) {
    throw std::invalid_argument(fmt::format(
        "URL '{}' names no file; give the relative path to store it under as a second column",
        url_for_messages(url)));
  }
  return relative;
}

std::vector<UrlListEntry> parse_url_list(std::string_view text, std::string_view list_name) {
  std::vector<UrlListEntry> entries;
  std::unordered_map<std::string, size_t> line_of_path;
  for_each_content_line(text, [&](size_t line_number, std::string_view line) {
    const std::string context = fmt::format("{}:{}", list_name, line_number);
    const auto space = line.find_first_of(" \t");
    const std::string_view url = line.substr(0, space);
    const std::string_view path_column =
        space == std::string_view::npos ? std::string_view{} : trim(line.substr(space));
    if (!starts_with_http_scheme(url)) {
      throw std::invalid_argument(fmt::format("{}: '{}' is not an http:// or https:// URL", context,
                                              url_for_messages(url)));
    }
    UrlListEntry entry;
    entry.url = std::string(url);
    entry.line = line_number;
    if (!path_column.empty()) {
      entry.relative_path = normalize_relative_path(path_column, context);  // names `context`
    } else {
      try {
        entry.relative_path = url_to_relative_path(url);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(fmt::format("{}: {}", context, e.what()));
      }
    }
    if (entry.relative_path.empty()) {
      throw std::invalid_argument(fmt::format("{}: the relative path is empty", context));
    }
    if (!line_of_path.emplace(entry.relative_path, line_number).second) {
      throw std::invalid_argument(
          fmt::format("{}: path '{}' is listed twice; give distinct paths as a second column",
                      context, entry.relative_path));
    }
    entries.push_back(std::move(entry));
  });
  if (entries.empty()) {
    throw std::invalid_argument(fmt::format("URL list '{}' lists no URLs", list_name));
  }
  // A path that another entry needs as a directory would only fail once everything has been
  // downloaded; say so now, naming both lines.
  for (const auto& entry : entries) {
    for (size_t slash = entry.relative_path.find('/'); slash != std::string::npos;
         slash = entry.relative_path.find('/', slash + 1)) {
      const auto file = line_of_path.find(entry.relative_path.substr(0, slash));
      if (file != line_of_path.end()) {
        throw std::invalid_argument(fmt::format(
            "{}:{}: path '{}' needs '{}' to be a directory, but line {} stores a file there; "
            "give distinct paths as a second column",
            list_name, entry.line, entry.relative_path, file->first, file->second));
      }
    }
  }
  return entries;
}

std::unique_ptr<Source> open_source(const std::filesystem::path& source,
                                    const SourceOptions& options) {
  switch (detect_source_kind(source)) {
    case SourceKind::kDirectory:
      return make_directory_source(source, options);
    case SourceKind::kArchive:
      return make_archive_source(source, options);
    case SourceKind::kUrlList: {
      const std::string text = read_whole_file(source);
      auto entries = parse_url_list(text, source.string());
      return make_url_list_source(std::filesystem::absolute(source).string(), std::move(entries),
                                  options);
    }
  }
  throw std::logic_error("unhandled source kind");
}

}  // namespace dsfs::tools
