#pragma once
// Where a Redis server is and how to authenticate to it.
#include <string>
#include <string_view>

namespace dsfs::store {

struct RedisEndpoint {
  enum class Transport { kTcp, kUnix };
  Transport transport = Transport::kTcp;
  std::string host = "127.0.0.1";  // kTcp
  int port = 6379;                 // kTcp
  std::string socket_path;         // kUnix
  std::string user;                // empty: AUTH with password only (or no AUTH)
  std::string password;            // empty: no AUTH
  int db = 0;

  // URL form with the password replaced by "***", safe for logs and errors.
  std::string describe() const;
};

// Parses `redis://[[user]:password@]host[:port][/db]` and `unix:///path/to.sock[?db=N]`
// (percent-escapes in user and password are decoded). Throws std::invalid_argument whose
// message names the URL (password redacted) and what is wrong with it.
// `password_given_apart`: the caller has the password from elsewhere (a file, the environment),
// so `USER@` (an ACL user with no ':') is a user name; otherwise it is refused, as it may be a
// password missing its ':' (which argv scrubbing would then not hide).
RedisEndpoint parse_redis_url(std::string_view url, bool password_given_apart = false);

}  // namespace dsfs::store
