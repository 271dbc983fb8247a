#pragma once
#include <stdexcept>
#include <string>
#include <string_view>

namespace dsfs::store {

// The server could not be reached, the connection broke or timed out. Retrying may help.
class ConnectionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The server answered with an error reply (wrong type, NOAUTH, OOM...). Retrying will not help.
class ReplyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Error replies Redis gives while it cannot serve yet (loading its AOF/RDB after a restart, busy,
// a replica without its master, a cluster slot on the move, a slot without a primary during a
// failover): the server or the cluster is coming back, so callers count them as connection
// trouble (ConnectionError) that a retry with Backoff outlives.
inline bool is_transient_reply(std::string_view message) {
  return message.starts_with("LOADING") || message.starts_with("BUSY") ||
         message.starts_with("MASTERDOWN") || message.starts_with("TRYAGAIN") ||
         message.starts_with("CLUSTERDOWN");
}

// What to do about a NOPERM reply (an ACL user without a command or a key pattern dsfs needs),
// to append to the message; "" for any other reply.
inline std::string_view permission_hint(std::string_view message) {
  return message.starts_with("NOPERM")
             ? "; the Redis user lacks a permission this needs: grant it (docs/deploy.md, \"ACL "
               "users\", lists what each dsfs command needs)"
             : "";
}

}  // namespace dsfs::store
