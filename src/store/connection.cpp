#include "src/store/connection.h"

#include <fmt/core.h>
#include <hiredis/hiredis.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstring>
#include <iterator>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "src/store/errors.h"
#include "src/store/log_text.h"

namespace dsfs::store {
namespace {

timeval to_timeval(std::chrono::milliseconds duration) {
  const auto ms = std::max<long long>(duration.count(), 1);
  return timeval{.tv_sec = static_cast<time_t>(ms / 1000),
                 .tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000)};
}

// hiredis writes with write(2): a server that went away would raise SIGPIPE, whose default
// action kills the process. Ignored (unless the program installed its own handler), the write
// fails with EPIPE instead and becomes a ConnectionError.
void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      ::signal(SIGPIPE, SIG_IGN);
    }
  });
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
  if (is_error()) {
    throw ReplyError(
        fmt::format("{}: Redis replied '{}'{}", context, log_text(str()), permission_hint(str())));
  }
  return *this;
}

// ---- Connection -------------------------------------------------------------------------------

Connection::Connection(const RedisEndpoint& endpoint, const ConnectOptions& options)
    : endpoint_(endpoint), io_timeout_(options.io_timeout), readonly_(options.readonly) {
  ignore_sigpipe_once();
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
    handshake();
  } catch (...) {
    redisFree(std::exchange(ctx_, nullptr));
    throw;
  }
}

// AUTH, SELECT and a PING in one round trip. The PING reports here, not on the first real
// command, a server that wants a password or is still loading its data (SELECT and AUTH are
// allowed while loading; PING is not).
void Connection::handshake() {
  const std::string db = std::to_string(endpoint_.db);
  const bool authenticate = !endpoint_.password.empty();
  const bool select = endpoint_.db != 0;
  if (authenticate) {
    if (endpoint_.user.empty()) {
      append({"AUTH", endpoint_.password});
    } else {
      append({"AUTH", endpoint_.user, endpoint_.password});
    }
  }
  if (select) append({"SELECT", db});
  if (readonly_) append({"READONLY"});
  append({"PING"});
  Reply auth_reply = authenticate ? read_reply() : Reply();
  Reply select_reply = select ? read_reply() : Reply();
  Reply readonly_reply = readonly_ ? read_reply() : Reply();
  Reply ping_reply = read_reply();

  if (auth_reply.is_error()) {
    throw ReplyError(
        fmt::format("Redis at {} refused the credentials: {} (check the user and password given: "
                    "--redis-password-file, $DSFS_REDIS_PASSWORD or $REDISCLI_AUTH, or the URL's "
                    "user)",
                    endpoint_.describe(), auth_reply.str()));
  }
  if (select_reply.is_error()) {
    throw ReplyError(fmt::format("Redis at {} rejected SELECT {}: {}", endpoint_.describe(), db,
                                 select_reply.str()));
  }
  if (readonly_reply.is_error()) {
    throw ReplyError(fmt::format("Redis at {} rejected READONLY: {}", endpoint_.describe(),
                                 readonly_reply.str()));
  }
  if (ping_reply.is_error()) {
    const std::string_view message = ping_reply.str();
    if (is_transient_reply(message)) {
      throw ConnectionError(
          fmt::format("Redis at {} is not ready: {}", endpoint_.describe(), message));
    }
    if (message.starts_with("NOAUTH")) {
      throw ReplyError(fmt::format(
          "Redis at {} requires a password: give it with --redis-password-file FILE (its first "
          "line; mode 0600) or $DSFS_REDIS_PASSWORD, and the user, if not default, in the URL "
          "(redis://USER@host:port); a password in the URL itself shows in `ps` until dsfs "
          "starts",
          endpoint_.describe()));
    }
    throw ReplyError(fmt::format("Redis at {} rejected PING: {}{}", endpoint_.describe(),
                                 log_text(message), permission_hint(message)));
  }
}

Connection::Connection(Connection&& other) noexcept
    : endpoint_(std::move(other.endpoint_)),
      ctx_(std::exchange(other.ctx_, nullptr)),
      io_timeout_(other.io_timeout_),
      pending_(std::exchange(other.pending_, 0)),
      broken_(std::exchange(other.broken_, true)),
      readonly_(other.readonly_) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    if (ctx_) redisFree(ctx_);
    endpoint_ = std::move(other.endpoint_);
    ctx_ = std::exchange(other.ctx_, nullptr);
    io_timeout_ = other.io_timeout_;
    readonly_ = other.readonly_;
    pending_ = std::exchange(other.pending_, 0);
    broken_ = std::exchange(other.broken_, true);
  }
  return *this;
}

Connection::~Connection() {
  if (ctx_) redisFree(ctx_);
}

void Connection::interrupt() {
  if (ctx_ && ctx_->fd >= 0) ::shutdown(ctx_->fd, SHUT_RDWR);
}

void Connection::fail(std::string_view what) {
  broken_ = true;
  std::string reason = ctx_ && ctx_->err ? std::string(ctx_->errstr) : "connection closed";
  // SO_RCVTIMEO/SO_SNDTIMEO expiring shows up as EAGAIN.
  if (reason == std::strerror(EAGAIN) || reason == std::strerror(EWOULDBLOCK)) {
    reason = fmt::format("no reply within the I/O timeout of {} ms", io_timeout_.count());
  }
  throw ConnectionError(fmt::format("{} on Redis at {}: {}", what, endpoint_.describe(), reason));
}

void Connection::fail_io(std::string_view what, int error) {
  broken_ = true;
  const std::string reason =
      error == 0 ? "connection closed by the server"
      : error == EAGAIN || error == EWOULDBLOCK
          ? fmt::format("no reply within the I/O timeout of {} ms", io_timeout_.count())
          : std::string(std::strerror(error));
  throw ConnectionError(fmt::format("{} on Redis at {}: {}", what, endpoint_.describe(), reason));
}

namespace {

void append_get(std::string& out, std::string_view key) {
  fmt::format_to(std::back_inserter(out), "*2\r\n$3\r\nGET\r\n${}\r\n", key.size());
  out.append(key);
  out.append("\r\n");
}

}  // namespace

std::vector<ValueReply> Connection::get_values(std::span<const std::string> keys, size_t window) {
  if (pending_ != 0 || ctx_->reader->pos != ctx_->reader->len) {
    throw std::logic_error("get_values on a connection with replies still to read");
  }
  window = std::max<size_t>(window, 1);
  std::vector<ValueReply> replies(keys.size());
  ReplyReader reader(ctx_->fd);
  std::string commands;
  size_t sent = 0;
  for (size_t received = 0; received < keys.size(); ++received) {
    if (sent == received) {
      commands.clear();
      for (; sent < keys.size() && sent - received < window; ++sent) {
        append_get(commands, keys[sent]);
      }
      send_all(commands);
    }
    read_value(reader, replies[received]);
  }
  if (!reader.drained()) {
    broken_ = true;
    throw ConnectionError(
        fmt::format("Redis at {} sent more than the GET replies asked for", endpoint_.describe()));
  }
  return replies;
}

void Connection::read_value(ReplyReader& reader, ValueReply& reply) {
  const std::optional<GetReplyFailure> failure = read_get_reply(reader, reply);
  if (!failure) return;
  switch (failure->kind) {
    case GetReplyFailure::Kind::kIo:
      fail_io("cannot read a GET reply", failure->error);
    case GetReplyFailure::Kind::kLineTooLong:
      fail_io("reply line too long for GET", EPROTO);
    case GetReplyFailure::Kind::kMalformed:
      break;
  }
  broken_ = true;
  throw ConnectionError(fmt::format("{} from Redis at {}", failure->detail, endpoint_.describe()));
}

void Connection::send_all(std::string_view bytes) {
  for (size_t written = 0; written < bytes.size();) {
    const ssize_t n =
        ::send(ctx_->fd, bytes.data() + written, bytes.size() - written, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_io("cannot send GET", n < 0 ? errno : 0);
    written += static_cast<size_t>(n);
  }
}

GetStream::GetStream(Connection& connection) : connection_(connection) {
  if (connection.broken_ || !connection.ctx_) {
    throw ConnectionError(
        fmt::format("connection to Redis at {} is broken", connection.endpoint_.describe()));
  }
  if (connection.pending_ != 0 || connection.ctx_->reader->pos != connection.ctx_->reader->len) {
    throw std::logic_error("GetStream on a connection with replies still to read");
  }
  reader_ = std::make_unique<ReplyReader>(connection.ctx_->fd);
}

GetStream::~GetStream() {
  // Replies still owed would be read as answers to the connection's next command.
  if (outstanding_ != 0 || !reader_->drained()) connection_.broken_ = true;
}

void GetStream::send(std::span<const std::string> keys) {
  if (keys.empty()) return;
  commands_.clear();
  for (const std::string& key : keys) append_get(commands_, key);
  connection_.send_all(commands_);
  outstanding_ += keys.size();
}

int GetStream::fd() const {
  return connection_.ctx_->fd;
}

ValueReply GetStream::receive() {
  if (outstanding_ == 0) throw std::logic_error("GetStream::receive with no GET outstanding");
  ValueReply reply;
  connection_.read_value(*reader_, reply);
  --outstanding_;
  return reply;
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
