#pragma once
// A bounded pool of connections to one endpoint, reconnecting lazily after failures.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "src/store/connection.h"

namespace dsfs::store {

// Thread safety: internally synchronized; acquire() from any thread (it blocks while all
// connections are lent). mutex_ guards idle_, lent_ and connects_; available_ waits on it.
// Connecting happens outside the lock. A Lease, and the Connection it lends, belong to one thread.
class ConnectionPool {
 public:
  ConnectionPool(RedisEndpoint endpoint, size_t max_connections, ConnectOptions options = {});
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A borrowed connection; returned to the pool on destruction unless it broke.
  class Lease {
   public:
    Lease(ConnectionPool* pool, std::unique_ptr<Connection> conn);
    Lease(Lease&&) noexcept;
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    Connection& operator*() const { return *conn_; }
    Connection* operator->() const { return conn_.get(); }

   private:
    ConnectionPool* pool_;
    std::unique_ptr<Connection> conn_;
  };

  // Blocks while all max_connections are lent out. Connects when no idle connection exists;
  // throws ConnectionError/ReplyError if that fails.
  Lease acquire();

  // Closes the connections not lent out now (a node the topology no longer reads from: they
  // would stay open for nothing). Lent ones come back as usual.
  void close_idle();

  const RedisEndpoint& endpoint() const { return endpoint_; }
  // Total connects made (first connects plus reconnects), for stats.
  uint64_t connects() const;

 private:
  void give_back(std::unique_ptr<Connection> conn);
  RedisEndpoint endpoint_;
  ConnectOptions options_;
  size_t max_connections_;
  mutable std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t lent_ = 0;
  uint64_t connects_ = 0;
};

}  // namespace dsfs::store
