#pragma once
// The embedded default: a redis-server that dsfs starts itself, on a unix socket under DSFS_HOME.
#include <filesystem>
#include <string>

#include "src/store/redis_url.h"

namespace dsfs::store {

struct EmbeddedServerStatus {
  bool running = false;
  int pid = 0;  // 0 when not running
  std::filesystem::path socket;
  std::filesystem::path data_dir;
  std::filesystem::path log_file;
};

// Thread safety: not synchronized (the CLI uses it from one thread). Processes are serialized
// by a lock file instead: concurrent `dsfs` commands starting the server start one.
class EmbeddedServer {
 public:
  // home: $DSFS_HOME, else $HOME/.local/share/dsfs. Layout: home/redis/{redis.sock,
  // redis.pid, redis.log, redis.conf, data/}.
  explicit EmbeddedServer(std::filesystem::path home = default_home());
  static std::filesystem::path default_home();

  EmbeddedServerStatus status() const;
  // Starts redis-server (daemonized, AOF+RDB persistence in data/) unless running; waits until
  // it answers PING (up to 10 s). Returns true if it started it, false if already running.
  // Throws std::runtime_error naming the log file when it cannot start (no redis-server
  // binary: says to install Debian's redis-server package).
  bool start();
  // SHUTDOWN SAVE and waits for the process to exit. Returns false if it was not running.
  bool stop();
  RedisEndpoint endpoint() const;  // unix socket endpoint

 private:
  std::filesystem::path home_;
};

}  // namespace dsfs::store
