#include "tools/ingest_writer.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>

#include "src/store/errors.h"
#include "tools/progress.h"

namespace dsfs::tools {
namespace {

using Clock = std::chrono::steady_clock;
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

RedisPieceWriter::RedisPieceWriter(const store::RedisEndpoint& endpoint,
                                   const catalog::KeySchema& keys, std::string dataset,
                                   uint64_t generation, WriterOptions options,
                                   const std::atomic<bool>* external_stop, Progress* progress)
    : endpoint_(endpoint),
      keys_(keys),
      dataset_(std::move(dataset)),
      generation_(generation),
      options_(std::move(options)),
      external_stop_(external_stop),
      progress_(progress) {
  options_.connections = std::max(options_.connections, 1u);
  options_.window_pieces = std::max<size_t>(options_.window_pieces, 1);
  std::vector<store::Connection> connections;
  connections.reserve(options_.connections);
  for (unsigned i = 0; i < options_.connections; ++i) {
    connections.emplace_back(endpoint_);
  }
  workers_.reserve(connections.size());
  try {
    for (auto& connection : connections) {
      workers_.emplace_back([this, c = std::move(connection)]() mutable { worker(std::move(c)); });
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

void RedisPieceWriter::put_piece(const PieceKey& key, std::string bytes, bool completes_object) {
  const uint64_t size = bytes.size();
  std::string redis_key =
      keys_.object_piece(dataset_, generation_, key.object_id, key.chunk_index, key.chunked);
  std::unique_lock lock(mutex_);
  // One piece larger than the whole budget still goes through, alone.
  while (!stop_requested() && bytes_in_flight_ > 0 &&
         bytes_in_flight_ + size > options_.max_bytes_in_flight) {
    space_ready_.wait_for(lock, kStopPollInterval);
  }
  if (stop_requested()) throw StopRequested();
  bytes_in_flight_ += size;
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

void RedisPieceWriter::worker(store::Connection connection) {
  try {
    std::optional<store::Connection> conn(std::move(connection));
    std::deque<Piece> outstanding;
    uint64_t outstanding_bytes = 0;
    std::optional<Clock::time_point> failing_since;

    auto send = [&](const Piece& piece) {
      conn->append(
          {std::string_view("SET"), std::string_view(piece.key), std::string_view(piece.bytes)});
    };
    std::chrono::milliseconds backoff{50};
    // Sleeps `backoff`, then tries once to connect again; false (and the backoff doubled, up to
    // 1 s) while Redis stays away (within budget).
    auto try_reconnect = [&](const std::string& cause) {
      const auto deadline = Clock::now() + backoff;
      while (Clock::now() < deadline) {
        if (stop_requested()) return false;
        std::this_thread::sleep_for(
            std::min<Clock::duration>(kStopPollInterval, deadline - Clock::now()));
      }
      if (Clock::now() - *failing_since > options_.reconnect_budget) {
        throw store::ConnectionError(fmt::format(
            "lost the connection to Redis at {} while writing dataset '{}' and could not get it "
            "back within {} s ({}); check that the server is up and reachable",
            endpoint_.describe(), dataset_,
            std::chrono::duration_cast<std::chrono::seconds>(options_.reconnect_budget).count(),
            cause));
      }
      try {
        conn.emplace(endpoint_);
      } catch (const store::ConnectionError&) {
        backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
        return false;
      }
      for (const auto& piece : outstanding) send(piece);
      return true;
    };

    for (;;) {
      if (!conn) {
        if (stop_requested()) return;
        if (!try_reconnect("reconnect failed")) continue;
      }
      while (outstanding.size() < options_.window_pieces &&
             (outstanding.empty() || outstanding_bytes < options_.window_bytes)) {
        Piece piece;
        if (!pop(piece, outstanding.empty())) break;
        send(piece);  // only buffers; I/O happens in read_reply
        outstanding_bytes += piece.bytes.size();
        outstanding.push_back(std::move(piece));
      }
      if (outstanding.empty() || stop_requested()) return;  // drained, or stopping
      try {
        const store::Reply reply = conn->read_reply();
        Piece done = std::move(outstanding.front());
        outstanding.pop_front();
        if (reply.is_error()) {
          throw store::ReplyError(fmt::format("Redis at {} refused to store '{}': {}{}",
                                              endpoint_.describe(), done.key, reply.str(),
                                              hint_for(reply.str())));
        }
        failing_since.reset();
        backoff = std::chrono::milliseconds(50);
        outstanding_bytes -= done.bytes.size();
        release(done.bytes.size());
        // Progress counts what Redis holds, not what was read ahead of it.
        if (progress_) progress_->add(done.completes_object ? 1 : 0, done.bytes.size());
        const uint64_t pieces = ++pieces_written_;
        if (options_.on_piece_written) options_.on_piece_written(pieces);
      } catch (const store::ConnectionError& e) {
        if (!failing_since) {
          failing_since = Clock::now();
          spdlog::warn("connection to Redis at {} broke while writing ({}); reconnecting",
                       endpoint_.describe(), e.what());
        }
        conn.reset();
        try_reconnect(e.what());
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
