#include "src/store/redis_url.h"

#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <stdexcept>

#include "src/store/log_text.h"

namespace dsfs::store {
namespace {

constexpr std::string_view kTcpScheme = "redis://";
constexpr std::string_view kUnixScheme = "unix://";
constexpr std::string_view kTlsScheme = "rediss://";

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() &&
         std::equal(prefix.begin(), prefix.end(), text.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) ==
                  std::tolower(static_cast<unsigned char>(b));
         });
}

// Where the credentials of `url` sit (offset, length), if it has any. Shared by the parser and
// the redaction of URLs in error messages so both agree on what the password is.
struct UserInfoSpan {
  size_t begin;
  size_t end;  // position of the '@' that closes it
};

std::optional<UserInfoSpan> find_user_info(std::string_view url) {
  if (starts_with_ignoring_case(url, kUnixScheme)) {
    const size_t begin = kUnixScheme.size();
    if (begin >= url.size() || url[begin] == '/') return std::nullopt;
    // unix://[user:]password@/path: the first "@/" closes the credentials.
    const size_t at = url.find("@/", begin);
    if (at == std::string_view::npos) return std::nullopt;
    return UserInfoSpan{begin, at};
  }
  const size_t scheme_end = url.find("://");
  // Without one (a mistyped scheme: "redis//:pw@host", ":pw@host"), all before the last '@' is
  // taken as user-info: it may hold a password.
  const size_t begin = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  // Host, port, db and query never contain '@', so the last one closes the credentials (which
  // lets a raw ':' or '/' appear in a password).
  const size_t at = url.rfind('@');
  if (at == std::string_view::npos || at < begin) return std::nullopt;
  return UserInfoSpan{begin, at};
}

// The URL as typed, with the password replaced by "***" (the whole user-info when it has no
// ':', since then it is most likely a password).
std::string redact(std::string_view url) {
  const auto info = find_user_info(url);
  if (!info) return std::string(url);
  const std::string_view user_info = url.substr(info->begin, info->end - info->begin);
  const size_t colon = user_info.find(':');
  const size_t secret_begin =
      colon == std::string_view::npos ? info->begin : info->begin + colon + 1;
  return fmt::format("{}***{}", url.substr(0, secret_begin), url.substr(info->end));
}

[[noreturn]] void reject(std::string_view url, std::string_view problem) {
  throw std::invalid_argument(fmt::format("invalid Redis URL '{}': {}", redact(url), problem));
}

std::optional<long long> parse_decimal(std::string_view text) {
  if (text.empty() || text.size() > 18) return std::nullopt;
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view url, std::string_view text, std::string_view what) {
  std::string decoded;
  decoded.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      decoded.push_back(text[i]);
      continue;
    }
    const int high = i + 1 < text.size() ? hex_digit(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? hex_digit(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      reject(url, fmt::format("bad percent-escape in the {} (write '%' as %25)", what));
    }
    decoded.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return decoded;
}

int parse_db(std::string_view url, std::string_view text) {
  const auto db = parse_decimal(text);
  if (!db || *db > 1'000'000) {
    reject(url, fmt::format("database '{}' is not a non-negative integer", text));
  }
  return static_cast<int>(*db);
}

// Applies "?db=N" (the only query parameter dsfs knows) to `endpoint`.
void apply_query(std::string_view url, std::string_view query, RedisEndpoint& endpoint,
                 bool db_already_set) {
  if (query.empty()) reject(url, "empty query after '?'");
  if (!query.starts_with("db=") || query.find('&') != std::string_view::npos) {
    reject(url, fmt::format("unsupported query '{}' (only ?db=N is understood)", query));
  }
  if (db_already_set) reject(url, "database given twice (path and ?db=)");
  endpoint.db = parse_db(url, query.substr(3));
}

void apply_user_info(std::string_view url, std::string_view user_info, RedisEndpoint& endpoint,
                     bool password_given_apart) {
  const size_t colon = user_info.find(':');
  if (colon == std::string_view::npos) {
    if (password_given_apart) {
      endpoint.user = percent_decode(url, user_info, "user name");
      if (endpoint.user.empty()) reject(url, "empty user name before '@'");
      return;
    }
    reject(url,
           "credentials must be ':PASSWORD@' or 'USER:PASSWORD@' (missing ':'); an ACL user "
           "whose password stays out of the URL is 'USER@' with --redis-password-file or "
           "$DSFS_REDIS_PASSWORD");
  }
  endpoint.user = percent_decode(url, user_info.substr(0, colon), "user name");
  endpoint.password = percent_decode(url, user_info.substr(colon + 1), "password");
  if (endpoint.password.empty()) reject(url, "empty password after ':'");
}

// parse_tcp and parse_unix: `rest` is the URL after its scheme and credentials.
void parse_tcp(std::string_view url, std::string_view rest, RedisEndpoint& endpoint) {
  endpoint.transport = RedisEndpoint::Transport::kTcp;
  std::string_view query;
  bool has_query = false;
  if (const size_t question = rest.find('?'); question != std::string_view::npos) {
    query = rest.substr(question + 1);
    has_query = true;
    rest = rest.substr(0, question);
  }
  std::string_view path;
  bool has_path = false;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    has_path = true;
    rest = rest.substr(0, slash);
  }

  std::string_view host = rest;
  std::string_view port;
  bool has_port = false;
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) reject(url, "IPv6 address is missing its closing ']'");
    host = rest.substr(1, close - 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') reject(url, "expected ':PORT' after the IPv6 address");
      port = after.substr(1);
      has_port = true;
    }
    if (host.empty() || host.find_first_not_of("0123456789abcdefABCDEF:.") != host.npos) {
      reject(url, fmt::format("'{}' is not an IPv6 address", host));
    }
  } else if (const size_t colon = rest.find(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    has_port = true;
    if (port.find(':') != std::string_view::npos) {
      reject(url, "an IPv6 host must be written in brackets, e.g. redis://[::1]:6379");
    }
  }
  if (host.empty()) reject(url, "missing host (e.g. redis://127.0.0.1:6379)");
  if (host.find_first_of(" \t\r\n%") != std::string_view::npos) {
    reject(url, fmt::format("host '{}' contains invalid characters", host));
  }
  endpoint.host = std::string(host);

  if (has_port) {
    const auto number = parse_decimal(port);
    if (!number) reject(url, fmt::format("port '{}' is not a number", port));
    if (*number < 1 || *number > 65535) {
      reject(url, fmt::format("port {} is out of range 1-65535", *number));
    }
    endpoint.port = static_cast<int>(*number);
  }
  const bool db_in_path = has_path && !path.empty();
  if (db_in_path) endpoint.db = parse_db(url, path);
  if (has_query) apply_query(url, query, endpoint, db_in_path);
}

void parse_unix(std::string_view url, std::string_view rest, RedisEndpoint& endpoint) {
  endpoint.transport = RedisEndpoint::Transport::kUnix;
  if (!rest.starts_with('/')) {
    reject(url, "the socket path must be absolute, e.g. unix:///run/redis/redis.sock");
  }
  if (const size_t question = rest.find('?'); question != std::string_view::npos) {
    apply_query(url, rest.substr(question + 1), endpoint, false);
    rest = rest.substr(0, question);
  }
  if (rest.size() <= 1 || rest.ends_with('/')) reject(url, "missing socket path");
  endpoint.socket_path = std::string(rest);
}

}  // namespace

std::string RedisEndpoint::describe() const {
  // For logs and errors: the password masked, the rest escaped (it is user-supplied).
  std::string credentials;
  if (!password.empty()) credentials = fmt::format("{}:***@", log_text(user, 64));
  if (transport == Transport::kUnix) {
    std::string text = fmt::format("unix://{}{}", credentials, log_text(socket_path));
    if (db != 0) text += fmt::format("?db={}", db);
    return text;
  }
  const bool ipv6 = host.find(':') != std::string::npos;
  std::string text = ipv6 ? fmt::format("redis://{}[{}]:{}", credentials, log_text(host), port)
                          : fmt::format("redis://{}{}:{}", credentials, log_text(host), port);
  if (db != 0) text += fmt::format("/{}", db);
  return text;
}

RedisEndpoint parse_redis_url(std::string_view url, bool password_given_apart) {
  RedisEndpoint endpoint;
  if (url.empty()) reject(url, "empty URL");
  if (url.find_first_of(" \t\r\n") != std::string_view::npos) reject(url, "contains whitespace");
  const bool tcp = starts_with_ignoring_case(url, kTcpScheme);
  if (!tcp && !starts_with_ignoring_case(url, kUnixScheme)) {
    if (starts_with_ignoring_case(url, kTlsScheme)) {
      reject(url, "TLS (rediss://) is not supported by this build (hiredis 0.14 has no TLS)");
    }
    reject(url, "expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or unix:///PATH/TO.sock");
  }
  std::string_view rest = url.substr(tcp ? kTcpScheme.size() : kUnixScheme.size());
  if (const auto info = find_user_info(url)) {
    apply_user_info(url, url.substr(info->begin, info->end - info->begin), endpoint,
                    password_given_apart);
    rest = url.substr(info->end + 1);
  }
  if (tcp) {
    parse_tcp(url, rest, endpoint);
  } else {
    parse_unix(url, rest, endpoint);
  }
  return endpoint;
}

}  // namespace dsfs::store
