#pragma once
#include <stdexcept>
#include <string>

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

}  // namespace dsfs::store
