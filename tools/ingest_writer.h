#pragma once
// Writes the pieces sources produce to Redis: several writer threads, each keeping a sliding
// window of pipelined SETs on connections of its own (one per node of a cluster: each SET goes
// to its key's primary), fed from a queue bounded in bytes so reading never runs far ahead of
// writing. After a broken connection a writer connects again and sends its unacknowledged SETs
// again.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "tools/ingest_object.h"

namespace dsfs::tools {

class Progress;

struct WriterOptions {
  unsigned connections = 4;                     // writer threads
  size_t window_pieces = 32;                    // pipelined SETs outstanding per writer
  uint64_t window_bytes = 16ull << 20;          // and their bytes
  uint64_t max_bytes_in_flight = 256ull << 20;  // queued plus unacknowledged, all connections
  // How long a writer may keep failing to reach Redis before the ingest gives up.
  std::chrono::milliseconds reconnect_budget{15000};
  // Called (from writer threads) after each acknowledged piece with the total so far; tests use
  // it to interrupt an ingest part-way.
  std::function<void(uint64_t pieces_written)> on_piece_written;
};

class RedisPieceWriter final : public SourceSink {
 public:
  // Starts the writer threads; each connects to a node when it first writes there. `client`
  // must outlive the writer. `external_stop` (may be null) is polled: when it becomes true the
  // writer stops like after an error.
  RedisPieceWriter(store::Client& client, const catalog::KeySchema& keys, std::string dataset,
                   uint64_t generation, WriterOptions options,
                   const std::atomic<bool>* external_stop = nullptr, Progress* progress = nullptr);
  ~RedisPieceWriter() override;
  RedisPieceWriter(const RedisPieceWriter&) = delete;
  RedisPieceWriter& operator=(const RedisPieceWriter&) = delete;

  void reserve(uint64_t bytes, bool holding) override;
  void unreserve(uint64_t bytes) override;
  void put_piece(const PieceKey& key, std::string bytes, bool completes_object) override;
  bool stop_requested() const override;
  void expect_totals(uint64_t files, uint64_t bytes) override;
  void input_position(uint64_t consumed, uint64_t total) override;

  // Waits until every piece put so far is acknowledged by Redis. Throws the first write error,
  // or StopRequested if the external stop was set.
  void finish();
  // Stops the writers and drops queued pieces (after a source error). Idempotent.
  void abort();
  // The first write error, if any.
  std::exception_ptr error() const;

 private:
  struct Piece {
    std::string key;
    std::string bytes;
    bool completes_object = false;
  };
  void worker();
  bool pop(Piece& piece, bool wait);
  void release(uint64_t bytes);
  void fail(std::exception_ptr error);
  void join_workers();

  store::Client& client_;
  catalog::KeySchema keys_;
  std::string dataset_;
  uint64_t generation_;
  WriterOptions options_;
  const std::atomic<bool>* external_stop_;
  Progress* progress_;

  mutable std::mutex mutex_;
  std::condition_variable queue_ready_;  // a piece was queued, or closing/stopping
  std::condition_variable space_ready_;  // bytes were released, or stopping
  std::deque<Piece> queue_;
  // Reserved by sources (being read) plus put and not yet acknowledged; bounded by
  // max_bytes_in_flight, except that a reservation finding nothing in flight (one piece larger
  // than the bound), or a holder's finding nothing put (below), goes through.
  uint64_t bytes_in_flight_ = 0;
  uint64_t bytes_put_ = 0;  // of which put (queued or sent) and not yet acknowledged
  bool closing_ = false;
  std::atomic<bool> stopping_{false};
  std::exception_ptr error_;
  std::atomic<uint64_t> pieces_written_{0};
  std::vector<std::thread> workers_;
};

}  // namespace dsfs::tools
