#include "tools/ingest_writer.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>

#include "src/store/errors.h"
#include "tools/progress.h"

namespace dsfs::tools {
namespace {

constexpr auto kStopPollInterval = std::chrono::milliseconds(100);

// What to do about an error reply to a SET, by its error code.
std::string_view hint_for(std::string_view error_reply) {
  if (error_reply.starts_with("OOM")) {
    return "; Redis reached its maxmemory: raise maxmemory, remove datasets with `dsfs rm`, or "
           "use a larger server";
  }
  if (error_reply.starts_with("NOAUTH") || error_reply.starts_with("WRONGPASS") ||
      error_reply.starts_with("NOPERM")) {
    return "; check the user and password in --redis and the user's ACL permissions";
  }
  if (error_reply.starts_with("READONLY")) return "; this is a read-only replica: use the primary";
  if (error_reply.starts_with("MISCONF")) {
    return "; Redis cannot persist to disk: see its log and free disk space";
  }
  return "";
}

}  // namespace

RedisPieceWriter::RedisPieceWriter(store::Client& client, const catalog::KeySchema& keys,
                                   std::string dataset, uint64_t generation, WriterOptions options,
                                   const std::atomic<bool>* external_stop, Progress* progress)
    : client_(client),
      keys_(keys),
      dataset_(std::move(dataset)),
      generation_(generation),
      options_(std::move(options)),
      external_stop_(external_stop),
      progress_(progress) {
  options_.connections = std::max(options_.connections, 1u);
  options_.window_pieces = std::max<size_t>(options_.window_pieces, 1);
  workers_.reserve(options_.connections);
  try {
    for (unsigned i = 0; i < options_.connections; ++i) {
      workers_.emplace_back([this] { worker(); });
    }
  } catch (...) {
    abort();
    throw;
  }
}

RedisPieceWriter::~RedisPieceWriter() {
  abort();
}

bool RedisPieceWriter::stop_requested() const {
  return stopping_ || (external_stop_ && external_stop_->load());
}

void RedisPieceWriter::reserve(uint64_t bytes, bool holding) {
  std::unique_lock lock(mutex_);
  // One piece larger than the whole budget still goes through, alone. A source holding part of
  // a piece waits only for stored bytes to be acknowledged: were every byte in flight held by
  // sources each waiting for more, none would ever be released.
  while (!stop_requested() && bytes_in_flight_ > 0 &&
         bytes_in_flight_ + bytes > options_.max_bytes_in_flight && (!holding || bytes_put_ > 0)) {
    space_ready_.wait_for(lock, kStopPollInterval);
  }
  if (stop_requested()) throw StopRequested();
  bytes_in_flight_ += bytes;
}

void RedisPieceWriter::unreserve(uint64_t bytes) {
  {
    std::lock_guard lock(mutex_);
    bytes_in_flight_ -= std::min(bytes, bytes_in_flight_ - bytes_put_);
  }
  space_ready_.notify_all();
}

void RedisPieceWriter::put_piece(const PieceKey& key, std::string bytes, bool completes_object) {
  const uint64_t size = bytes.size();
  std::string redis_key =
      keys_.object_piece(dataset_, generation_, key.object_id, key.chunk_index, key.chunked);
  std::unique_lock lock(mutex_);
  if (stop_requested()) throw StopRequested();
  bytes_put_ += size;  // reserved before it was read
  // (A piece put without a reservation is counted now, so that its release cannot underflow.)
  bytes_in_flight_ = std::max(bytes_in_flight_, bytes_put_);
  queue_.push_back(Piece{std::move(redis_key), std::move(bytes), completes_object});
  lock.unlock();
  queue_ready_.notify_one();
}

bool RedisPieceWriter::pop(Piece& piece, bool wait) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (stop_requested()) return false;
    if (!queue_.empty()) {
      piece = std::move(queue_.front());
      queue_.pop_front();
      return true;
    }
    if (!wait || closing_) return false;
    queue_ready_.wait_for(lock, kStopPollInterval);
  }
}

void RedisPieceWriter::release(uint64_t bytes) {
  {
    std::lock_guard lock(mutex_);
    bytes_in_flight_ -= bytes;
    bytes_put_ -= bytes;
  }
  space_ready_.notify_all();
}

void RedisPieceWriter::fail(std::exception_ptr error) {
  {
    std::lock_guard lock(mutex_);
    if (!error_) error_ = std::move(error);
    stopping_ = true;
  }
  queue_ready_.notify_all();
  space_ready_.notify_all();
}

void RedisPieceWriter::worker() {
  try {
    store::RoutedPipeline pipeline(client_);
    // Sent and not yet acknowledged, oldest first. The pipeline points into these pieces' key
    // and bytes (to send a redirected SET again), so they stay here until their reply is read.
    std::deque<Piece> outstanding;
    uint64_t outstanding_bytes = 0;
    bool resend = false;  // the pipeline was reset: every outstanding piece goes out again
    std::optional<store::Backoff> reconnecting;  // while Redis keeps failing: the budget left

    auto send = [&](const Piece& piece) {
      const std::array<std::string_view, 3> argv = {"SET", piece.key, piece.bytes};
      pipeline.append(argv);  // only buffers (connecting on a node's first use)
    };

    for (;;) {
      if (stop_requested()) return;
      try {
        if (resend) {
          for (const Piece& piece : outstanding) send(piece);
          resend = false;
        }
        while (outstanding.size() < options_.window_pieces &&
               (outstanding.empty() || outstanding_bytes < options_.window_bytes)) {
          Piece piece;
          if (!pop(piece, outstanding.empty())) break;
          outstanding_bytes += piece.bytes.size();
          outstanding.push_back(std::move(piece));
          send(outstanding.back());  // from its place in `outstanding`, where it stays
        }
        if (outstanding.empty() || stop_requested()) return;  // drained, or stopping
        const store::Reply reply = pipeline.read_reply();
        Piece done = std::move(outstanding.front());
        outstanding.pop_front();
        if (reply.is_error()) {
          throw store::ReplyError(fmt::format("Redis at {} refused to store '{}': {}{}",
                                              client_.describe(), done.key, reply.str(),
                                              hint_for(reply.str())));
        }
        reconnecting.reset();
        outstanding_bytes -= done.bytes.size();
        release(done.bytes.size());
        // Progress counts what Redis holds, not what was read ahead of it.
        if (progress_) progress_->add(done.completes_object ? 1 : 0, done.bytes.size());
        const uint64_t pieces = ++pieces_written_;
        if (options_.on_piece_written) options_.on_piece_written(pieces);
      } catch (const store::ConnectionError& e) {
        // What was sent may or may not have been stored: SET again is harmless.
        pipeline.reset();
        resend = true;
        if (!reconnecting) {
          reconnecting.emplace(options_.reconnect_budget);
          spdlog::warn("connection to Redis at {} broke while writing ({}); reconnecting",
                       client_.describe(), e.what());
        }
        if (!reconnecting->wait()) {
          throw store::ConnectionError(fmt::format(
              "lost the connection to Redis at {} while writing dataset '{}' and could not get it "
              "back within {} s ({}); check that the server is up and reachable",
              client_.describe(), dataset_,
              std::chrono::duration_cast<std::chrono::seconds>(options_.reconnect_budget).count(),
              e.what()));
        }
      }
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

void RedisPieceWriter::join_workers() {
  for (auto& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
}

void RedisPieceWriter::finish() {
  {
    std::lock_guard lock(mutex_);
    closing_ = true;
  }
  queue_ready_.notify_all();
  join_workers();
  if (const auto error = this->error()) std::rethrow_exception(error);
  if (stop_requested()) throw StopRequested();
  std::lock_guard lock(mutex_);
  if (!queue_.empty()) throw std::logic_error("ingest writer finished with pieces still queued");
}

void RedisPieceWriter::abort() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    closing_ = true;
  }
  queue_ready_.notify_all();
  space_ready_.notify_all();
  join_workers();
  std::lock_guard lock(mutex_);
  queue_.clear();
  bytes_in_flight_ = 0;
  bytes_put_ = 0;
}

std::exception_ptr RedisPieceWriter::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void RedisPieceWriter::expect_totals(uint64_t files, uint64_t bytes) {
  if (progress_) progress_->set_totals(files, bytes);
}

void RedisPieceWriter::input_position(uint64_t consumed, uint64_t total) {
  if (progress_) progress_->set_input_position(consumed, total);
}

}  // namespace dsfs::tools
