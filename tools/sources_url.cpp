// A list of http(s) URLs, fetched by several threads (one libcurl easy handle each, reused so
// connections are kept alive), each download streamed into its object as it arrives.
#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <exception>
#include <memory>
#include <stdexcept>
#include <thread>

#include "src/store/log_text.h"
#include "tools/sources.h"
#include "tools/sources_internal.h"

namespace dsfs::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct CurlEasyDeleter {
  void operator()(CURL* handle) const { curl_easy_cleanup(handle); }
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;

// State one transfer's callbacks share with the thread running it. Exceptions never cross
// libcurl's C frames: a callback stores them here and aborts the transfer.
struct Transfer {
  ObjectStream* stream = nullptr;
  SourceSink* sink = nullptr;
  const std::atomic<bool>* stop = nullptr;
  std::exception_ptr error;

  bool stopping() const { return *stop || sink->stop_requested(); }
};

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* transfer = static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  try {
    if (transfer->stopping()) throw StopRequested();
    transfer->stream->append(std::string_view(data, bytes));
    return bytes;
  } catch (...) {
    transfer->error = std::current_exception();
    return bytes == 0 ? 1 : 0;  // any other count aborts the transfer
  }
}

int on_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<Transfer*>(user)->stopping() ? 1 : 0;
}

bool is_transient(CURLcode code, long http_status) {
  switch (code) {
    case CURLE_HTTP_RETURNED_ERROR:
      return http_status >= 500 || http_status == 408 || http_status == 429;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

class UrlListSource final : public Source {
 public:
  UrlListSource(std::string description, std::vector<UrlListEntry> entries,
                const SourceOptions& options)
      : Source(SourceKind::kUrlList, std::move(description)),
        entries_(std::move(entries)),
        options_(options) {
    detail::ensure_curl_initialised();
  }

  SourceContents read(SourceSink& sink) override {
    SourceContents contents;
    contents.files.resize(entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) {
      contents.files[i].path = entries_[i].relative_path;
      contents.files[i].object_id = i;
    }
    sink.expect_totals(entries_.size(), 0);

    detail::run_workers(
        options_.parallelism, entries_.size(), sink,
        [] {
          CurlEasy handle(curl_easy_init());
          if (!handle) throw std::runtime_error("cannot create a libcurl handle");
          return handle;
        },
        [&](size_t index, CurlEasy& handle, const std::atomic<bool>& stop) {
          fetch(handle.get(), entries_[index], contents.files[index], sink, stop);
        });
    return contents;
  }

 private:
  void fetch(CURL* handle, const UrlListEntry& entry, FileRecord& file, SourceSink& sink,
             const std::atomic<bool>& stop) const {
    ObjectStream stream(sink, file.object_id, options_.chunk_size, options_.checksum);
    Transfer transfer{&stream, &sink, &stop, nullptr};
    char error_text[CURL_ERROR_SIZE];
    const unsigned attempts = std::max(options_.url_attempts, 1u);
    const auto deadline = Clock::now() + options_.url_file_deadline;
    for (unsigned attempt = 1;; ++attempt) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      error_text[0] = '\0';
      transfer.error = nullptr;
      curl_easy_reset(handle);
      curl_easy_setopt(handle, CURLOPT_URL, entry.url.c_str());
      curl_easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(handle, CURLOPT_FOLLOWLOCATION, 1L);
      curl_easy_setopt(handle, CURLOPT_MAXREDIRS, 10L);
      curl_easy_setopt(handle, CURLOPT_FAILONERROR, 1L);
      curl_easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
      curl_easy_setopt(handle, CURLOPT_FILETIME, 1L);
      curl_easy_setopt(handle, CURLOPT_USERAGENT, "dsfs-ingest/0.1");
      curl_easy_setopt(handle, CURLOPT_ERRORBUFFER, error_text);
      curl_easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS,
                       static_cast<long>(options_.url_connect_timeout.count()));
      // A transfer averaging under the minimum rate over the stall timeout is abandoned (and
      // retried); a server that trickles a byte a second must not hold the ingest forever.
      curl_easy_setopt(handle, CURLOPT_LOW_SPEED_LIMIT,
                       static_cast<long>(std::max<uint64_t>(options_.url_min_bytes_per_second, 1)));
      curl_easy_setopt(handle, CURLOPT_LOW_SPEED_TIME,
                       std::max(1L, static_cast<long>(options_.url_stall_timeout.count() / 1000)));
      // Whatever the rate, the file's tries together end by its deadline.
      curl_easy_setopt(handle, CURLOPT_TIMEOUT_MS, std::max(1L, static_cast<long>(left.count())));
      curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, &on_body);
      curl_easy_setopt(handle, CURLOPT_WRITEDATA, &transfer);
      curl_easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, &on_progress);
      curl_easy_setopt(handle, CURLOPT_XFERINFODATA, &transfer);

      const CURLcode code = curl_easy_perform(handle);
      if (transfer.error) std::rethrow_exception(transfer.error);
      if (transfer.stopping()) throw StopRequested();
      long http_status = 0;
      curl_easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &http_status);
      if (code == CURLE_OK) {
        curl_off_t file_time = -1;
        curl_easy_getinfo(handle, CURLINFO_FILETIME_T, &file_time);
        const FileDigest digest = stream.finish();
        file.size = digest.size;
        file.checksum = digest.checksum;
        file.mtime_ns = detail::mtime_ns_from(
            file_time >= 0 ? static_cast<int64_t>(file_time) : std::time(nullptr), 0, file.path);
        file.mode = 0644;
        return;
      }
      const std::string reason = code == CURLE_HTTP_RETURNED_ERROR
                                     ? fmt::format("HTTP {}", http_status)
                                     : fmt::format("{}{}{}", curl_easy_strerror(code),
                                                   error_text[0] ? ": " : "", error_text);
      const bool deadline_passed = Clock::now() >= deadline;
      if (!is_transient(code, http_status) || attempt >= attempts || deadline_passed) {
        throw std::runtime_error(fmt::format(
            "cannot fetch '{}' (line {}): {} (after {} {}{})", url_for_messages(entry.url),
            entry.line, reason, attempt, attempt == 1 ? "attempt" : "attempts",
            deadline_passed ? fmt::format("; its deadline of {} s (--url-timeout) passed",
                                          options_.url_file_deadline.count() / 1000.0)
                            : ""));
      }
      const auto backoff = options_.url_retry_backoff * (1u << std::min(attempt - 1, 6u));
      spdlog::warn("fetching '{}' failed ({}); retrying in {} ms", url_for_messages(entry.url),
                   reason, backoff.count());
      sleep_unless_stopping(backoff, transfer);
      stream.restart();
    }
  }

  static void sleep_unless_stopping(std::chrono::milliseconds duration, const Transfer& transfer) {
    const auto deadline = Clock::now() + duration;
    while (Clock::now() < deadline) {
      if (transfer.stopping()) throw StopRequested();
      std::this_thread::sleep_for(
          std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
    }
  }

  std::vector<UrlListEntry> entries_;
  SourceOptions options_;
};

}  // namespace

std::unique_ptr<Source> make_url_list_source(std::string description,
                                             std::vector<UrlListEntry> entries,
                                             const SourceOptions& options) {
  return std::make_unique<UrlListSource>(std::move(description), std::move(entries), options);
}

}  // namespace dsfs::tools
