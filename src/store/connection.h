#pragma once
// One RAII hiredis connection, with AUTH/SELECT done at connect and pipelining.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/store/get_reply.h"
#include "src/store/redis_url.h"

struct redisContext;
struct redisReply;

namespace dsfs::store {

class GetStream;

// Owns one redisReply tree (freed on destruction). Movable, not copyable.
class Reply {
 public:
  Reply() = default;
  explicit Reply(redisReply* raw);
  Reply(Reply&&) noexcept;
  Reply& operator=(Reply&&) noexcept;
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  ~Reply();

  bool is_nil() const;
  bool is_error() const;
  bool is_string() const;  // bulk or status string
  bool is_integer() const;
  bool is_array() const;
  std::string_view str() const;  // bulk/status/error text; empty otherwise
  long long integer() const;     // integer replies; throws ReplyError otherwise
  size_t size() const;           // array length; 0 otherwise
  // Borrowed view of element i of an array reply (valid while *this lives).
  const redisReply* element(size_t i) const;
  static std::string_view element_str(const redisReply* r);
  // Throws ReplyError with `context` if this is an error reply; returns *this.
  const Reply& expect_ok(std::string_view context) const;
  redisReply* raw() const { return raw_; }

 private:
  redisReply* raw_ = nullptr;
};

struct ConnectOptions {
  std::chrono::milliseconds connect_timeout{2000};
  // Read/write timeout of every command; a stalled server then breaks the connection.
  std::chrono::milliseconds io_timeout{10000};
  // Sends READONLY after connecting: a cluster replica then serves reads of its slots.
  bool readonly = false;
};

// Thread safety: not synchronized: one thread uses a Connection at a time (the pool lends each
// to one thread). interrupt() alone may be called from another thread.
class Connection {
 public:
  // Connects, AUTHs and SELECTs. Throws ConnectionError (unreachable, timeout) or
  // ReplyError (AUTH refused), with a message naming endpoint.describe(). The first connection
  // sets SIGPIPE to ignored (if it has no handler) so a vanished server is an error, not death.
  Connection(const RedisEndpoint& endpoint, const ConnectOptions& options = {});
  Connection(Connection&&) noexcept;
  Connection& operator=(Connection&&) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  // Runs one command (binary-safe arguments). Throws ConnectionError on I/O failure
  // (after which broken() is true). Error replies are returned, not thrown.
  Reply command(std::span<const std::string_view> argv);
  Reply command(std::initializer_list<std::string_view> argv);

  // Pipelining: queue commands, then read their replies in order.
  void append(std::span<const std::string_view> argv);
  void append(std::initializer_list<std::string_view> argv);
  Reply read_reply();  // flushes queued commands; throws ConnectionError on failure
  // GETs `keys`, at most `window` outstanding, reading each value from the socket straight into
  // a buffer of its own. hiredis would read it 16 KiB at a time into its buffer and copy it
  // again into the reply: for image-sized values those two copies cost more than the rest of
  // the read path. Error and nil replies are returned; I/O failures and replies that are not
  // bulk strings throw ConnectionError (the connection is then broken()). Needs no commands
  // pending from append().
  std::vector<ValueReply> get_values(std::span<const std::string> keys, size_t window);

  size_t pending() const { return pending_; }

  // Wakes a thread blocked on this connection (it then fails with ConnectionError): for shutting
  // down a thread that may be waiting on a reply. Safe to call from another thread.
  void interrupt();

  bool broken() const { return broken_; }
  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  friend class GetStream;
  void read_value(ReplyReader& reader, ValueReply& reply);
  void send_all(std::string_view bytes);
  [[noreturn]] void fail(std::string_view what);
  [[noreturn]] void fail_io(std::string_view what, int error);
  void handshake();
  RedisEndpoint endpoint_;
  redisContext* ctx_ = nullptr;
  std::chrono::milliseconds io_timeout_{0};
  size_t pending_ = 0;
  bool broken_ = false;
  bool readonly_ = false;
};

// A sliding window of GETs on one connection: send keys whenever there is room, take each
// reply as soon as it arrives (in the order sent). The connection must have nothing pending;
// dropping a stream with replies still owed marks the connection broken (they would otherwise
// answer its next command). Failures throw ConnectionError, as Connection::get_values does.
class GetStream {
 public:
  explicit GetStream(Connection& connection);
  ~GetStream();
  GetStream(const GetStream&) = delete;
  GetStream& operator=(const GetStream&) = delete;

  void send(std::span<const std::string> keys);
  ValueReply receive();  // the reply to the oldest GET outstanding; blocks until it arrives
  size_t outstanding() const { return outstanding_; }
  // Bytes of a reply already read from the socket: receive() will not wait for the network.
  bool buffered() const { return !reader_->drained(); }
  int fd() const;  // the socket, to poll() several streams

 private:
  Connection& connection_;
  std::unique_ptr<ReplyReader> reader_;
  std::string commands_;
  size_t outstanding_ = 0;
};

// Runs `commands` on `conn` with at most `window` outstanding, calling on_reply(index, reply)
// for each reply in order. Throws ConnectionError if the connection breaks.
template <typename Commands, typename OnReply>
void pipeline(Connection& conn, const Commands& commands, size_t window, OnReply&& on_reply);

}  // namespace dsfs::store

#include "src/store/pipeline_impl.h"
