#include "src/store/connection.h"

#include <fmt/core.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <sys/time.h>

#include <stdexcept>
#include <utility>

#include "src/store/errors.h"

namespace dsfs::store {
namespace {

timeval to_timeval(std::chrono::milliseconds duration) {
  const auto ms = std::max<long long>(duration.count(), 1);
  return timeval{.tv_sec = static_cast<time_t>(ms / 1000),
                 .tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000)};
}

// Replies Redis sends while it cannot serve yet (loading its AOF/RDB after a restart): the
// server is coming back, so these count as connection trouble that a retry outlives.
bool is_transient_error(std::string_view message) {
  return message.starts_with("LOADING") || message.starts_with("BUSY") ||
         message.starts_with("MASTERDOWN");
}

}  // namespace

// ---- Reply ------------------------------------------------------------------------------------

Reply::Reply(redisReply* raw) : raw_(raw) {}

Reply::Reply(Reply&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}

Reply& Reply::operator=(Reply&& other) noexcept {
  if (this != &other) {
    if (raw_) freeReplyObject(raw_);
    raw_ = std::exchange(other.raw_, nullptr);
  }
  return *this;
}

Reply::~Reply() {
  if (raw_) freeReplyObject(raw_);
}

bool Reply::is_nil() const {
  return !raw_ || raw_->type == REDIS_REPLY_NIL;
}
bool Reply::is_error() const {
  return raw_ && raw_->type == REDIS_REPLY_ERROR;
}
bool Reply::is_string() const {
  return raw_ && (raw_->type == REDIS_REPLY_STRING || raw_->type == REDIS_REPLY_STATUS);
}
bool Reply::is_integer() const {
  return raw_ && raw_->type == REDIS_REPLY_INTEGER;
}
bool Reply::is_array() const {
  return raw_ && raw_->type == REDIS_REPLY_ARRAY;
}

std::string_view Reply::str() const {
  return element_str(raw_);
}

long long Reply::integer() const {
  if (!is_integer()) {
    throw ReplyError(fmt::format("expected an integer reply from Redis, got {}",
                                 is_error() ? fmt::format("error '{}'", str())
                                            : fmt::format("reply type {}", raw_ ? raw_->type : 0)));
  }
  return raw_->integer;
}

size_t Reply::size() const {
  return is_array() ? raw_->elements : 0;
}

const redisReply* Reply::element(size_t i) const {
  if (!is_array() || i >= raw_->elements) return nullptr;
  return raw_->element[i];
}

std::string_view Reply::element_str(const redisReply* r) {
  if (!r) return {};
  switch (r->type) {
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      return std::string_view(r->str, r->len);
    default:
      return {};
  }
}

const Reply& Reply::expect_ok(std::string_view context) const {
  if (is_error()) throw ReplyError(fmt::format("{}: Redis replied '{}'", context, str()));
  return *this;
}

// ---- Connection -------------------------------------------------------------------------------

Connection::Connection(const RedisEndpoint& endpoint, const ConnectOptions& options)
    : endpoint_(endpoint) {
  const timeval connect_timeout = to_timeval(options.connect_timeout);
  ctx_ = endpoint_.transport == RedisEndpoint::Transport::kUnix
             ? redisConnectUnixWithTimeout(endpoint_.socket_path.c_str(), connect_timeout)
             : redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, connect_timeout);
  if (!ctx_) {
    throw ConnectionError(
        fmt::format("cannot connect to Redis at {}: out of memory", endpoint_.describe()));
  }
  if (ctx_->err) {
    const std::string reason = ctx_->errstr;
    redisFree(std::exchange(ctx_, nullptr));
    throw ConnectionError(
        fmt::format("cannot connect to Redis at {}: {} (is redis-server running there?)",
                    endpoint_.describe(), reason));
  }
  // Values can be many MiB: keep the reader's buffer instead of freeing and regrowing it.
  ctx_->reader->maxbuf = 0;
  if (redisSetTimeout(ctx_, to_timeval(options.io_timeout)) != REDIS_OK) {
    fail("cannot set the I/O timeout");
  }
  // Detects a peer that vanished without closing (cable, VM); pointless on a unix socket.
  if (endpoint_.transport == RedisEndpoint::Transport::kTcp &&
      redisEnableKeepAlive(ctx_) != REDIS_OK) {
    spdlog::debug("TCP keepalive could not be enabled on {}", endpoint_.describe());
  }

  try {
    if (!endpoint_.password.empty()) {
      Reply auth = endpoint_.user.empty() ? command({"AUTH", endpoint_.password})
                                          : command({"AUTH", endpoint_.user, endpoint_.password});
      if (auth.is_error()) {
        throw ReplyError(fmt::format(
            "Redis at {} refused the credentials: {} (check the user and password in the URL)",
            endpoint_.describe(), auth.str()));
      }
    }
    // SELECT, or PING when there is nothing to select, so that a server that wants a password
    // or is still loading is reported here rather than on the first real command.
    const std::string db = std::to_string(endpoint_.db);
    Reply check = endpoint_.db != 0 ? command({"SELECT", db}) : command({"PING"});
    if (check.is_error()) {
      const std::string_view message = check.str();
      if (is_transient_error(message)) {
        throw ConnectionError(
            fmt::format("Redis at {} is not ready: {}", endpoint_.describe(), message));
      }
      if (message.starts_with("NOAUTH")) {
        throw ReplyError(fmt::format(
            "Redis at {} requires a password: give it in the URL, e.g. redis://:PASSWORD@host:port "
            "or redis://USER:PASSWORD@host:port",
            endpoint_.describe()));
      }
      throw ReplyError(fmt::format("Redis at {} rejected {}: {}", endpoint_.describe(),
                                   endpoint_.db != 0 ? "SELECT " + db : "PING", message));
    }
  } catch (...) {
    redisFree(std::exchange(ctx_, nullptr));
    throw;
  }
}

Connection::Connection(Connection&& other) noexcept
    : endpoint_(std::move(other.endpoint_)),
      ctx_(std::exchange(other.ctx_, nullptr)),
      pending_(std::exchange(other.pending_, 0)),
      broken_(std::exchange(other.broken_, true)) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    if (ctx_) redisFree(ctx_);
    endpoint_ = std::move(other.endpoint_);
    ctx_ = std::exchange(other.ctx_, nullptr);
    pending_ = std::exchange(other.pending_, 0);
    broken_ = std::exchange(other.broken_, true);
  }
  return *this;
}

Connection::~Connection() {
  if (ctx_) redisFree(ctx_);
}

void Connection::fail(std::string_view what) {
  broken_ = true;
  const std::string reason = ctx_ && ctx_->err ? std::string(ctx_->errstr) : "connection closed";
  throw ConnectionError(fmt::format("{} on Redis at {}: {}", what, endpoint_.describe(), reason));
}

Reply Connection::command(std::span<const std::string_view> argv) {
  append(argv);
  return read_reply();
}

Reply Connection::command(std::initializer_list<std::string_view> argv) {
  return command(std::span<const std::string_view>(argv.begin(), argv.size()));
}

void Connection::append(std::span<const std::string_view> argv) {
  if (broken_ || !ctx_) {
    throw ConnectionError(
        fmt::format("the connection to Redis at {} is broken", endpoint_.describe()));
  }
  if (argv.empty()) throw std::invalid_argument("a Redis command needs at least one argument");
  std::vector<const char*> pointers;
  std::vector<size_t> lengths;
  pointers.reserve(argv.size());
  lengths.reserve(argv.size());
  for (const std::string_view arg : argv) {
    pointers.push_back(arg.data() ? arg.data() : "");  // hiredis memcpy()s from it
    lengths.push_back(arg.size());
  }
  if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), pointers.data(),
                             lengths.data()) != REDIS_OK) {
    fail("cannot queue a command");
  }
  ++pending_;
}

void Connection::append(std::initializer_list<std::string_view> argv) {
  append(std::span<const std::string_view>(argv.begin(), argv.size()));
}

Reply Connection::read_reply() {
  if (broken_ || !ctx_) {
    throw ConnectionError(
        fmt::format("the connection to Redis at {} is broken", endpoint_.describe()));
  }
  if (pending_ == 0) throw std::logic_error("read_reply() without a queued command");
  void* raw = nullptr;
  if (redisGetReply(ctx_, &raw) != REDIS_OK || !raw) fail("lost the connection");
  --pending_;
  return Reply(static_cast<redisReply*>(raw));
}

}  // namespace dsfs::store
