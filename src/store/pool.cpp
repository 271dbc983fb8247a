#include "src/store/pool.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace dsfs::store {

ConnectionPool::ConnectionPool(RedisEndpoint endpoint, size_t max_connections,
                               ConnectOptions options)
    : endpoint_(std::move(endpoint)),
      options_(options),
      max_connections_(std::max<size_t>(max_connections, 1)) {}

ConnectionPool::~ConnectionPool() {
  std::lock_guard lock(mutex_);
  if (lent_ != 0) {
    spdlog::error("connection pool for {} destroyed with {} connection(s) still lent out",
                  endpoint_.describe(), lent_);
  }
}

ConnectionPool::Lease::Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn)
    : pool_(pool), conn_(std::move(conn)) {}

ConnectionPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), conn_(std::move(other.conn_)) {}

ConnectionPool::Lease::~Lease() {
  if (pool_) pool_->give_back(std::move(conn_));
}

ConnectionPool::Lease ConnectionPool::acquire() {
  {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [&] { return !idle_.empty() || lent_ < max_connections_; });
    ++lent_;
    if (!idle_.empty()) {
      std::unique_ptr<Connection> conn = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(conn));
    }
  }
  // Connect outside the lock: it can take up to the connect timeout.
  try {
    auto conn = std::make_unique<Connection>(endpoint_, options_);
    std::lock_guard lock(mutex_);
    ++connects_;
    return Lease(this, std::move(conn));
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      --lent_;
    }
    available_.notify_one();
    throw;
  }
}

void ConnectionPool::close_idle() {
  std::vector<std::unique_ptr<Connection>> closing;
  {
    std::lock_guard lock(mutex_);
    closing.swap(idle_);
  }
  // Closed here, outside the lock.
}

void ConnectionPool::give_back(std::unique_ptr<Connection> conn) {
  {
    std::lock_guard lock(mutex_);
    --lent_;
    // A connection with replies still unread (its user threw mid-pipeline) would hand the next
    // user someone else's replies, so it is dropped like a broken one.
    const bool reusable = conn && !conn->broken() && conn->pending() == 0;
    if (reusable) {
      idle_.push_back(std::move(conn));
    } else if (conn && conn->broken()) {
      // A broken connection usually means the server restarted or went away; the idle ones are
      // then dead too, and trying each in turn would cost one failure per connection.
      idle_.clear();
    }
  }
  available_.notify_one();
}

uint64_t ConnectionPool::connects() const {
  std::lock_guard lock(mutex_);
  return connects_;
}

}  // namespace dsfs::store
