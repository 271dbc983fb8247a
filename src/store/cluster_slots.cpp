#include "src/store/cluster_slots.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <stdexcept>

#include "src/store/errors.h"

namespace dsfs::store {

uint16_t crc16(std::string_view bytes) {
  uint16_t crc = 0;
  for (const char c : bytes) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(c) << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc;
}

std::string_view hash_tag(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

uint32_t key_slot(std::string_view key) {
  return crc16(hash_tag(key)) % kClusterSlots;
}

namespace {

template <typename Int>
std::optional<Int> parse_number(std::string_view text) {
  Int value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// "host:port", the port after the last ':' (an IPv6 host has colons of its own).
std::optional<ClusterNode> parse_address(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::optional<int> port = parse_number<int>(address.substr(colon + 1));
  if (!port || *port <= 0 || *port > 65535) return std::nullopt;
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return ClusterNode{std::string(host), *port, {}};
}

std::string_view text_of(const redisReply* r) {
  return r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
             ? std::string_view(r->str, r->len)
             : std::string_view();
}

ClusterNode node_of(const redisReply* r, std::string_view asked_host) {
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
      r->element[1]->type != REDIS_REPLY_INTEGER) {
    throw std::invalid_argument("CLUSTER SLOTS: a node is not [host, port, ...]");
  }
  ClusterNode node;
  const redisReply* host = r->element[0];
  if (host->type == REDIS_REPLY_NIL || text_of(host).empty() || text_of(host) == "?") {
    node.host = std::string(asked_host);
  } else if (host->type == REDIS_REPLY_STRING || host->type == REDIS_REPLY_STATUS) {
    node.host = std::string(text_of(host));
  } else {
    throw std::invalid_argument("CLUSTER SLOTS: a node's host is not a string");
  }
  const long long port = r->element[1]->integer;
  if (port <= 0 || port > 65535) {
    throw std::invalid_argument(fmt::format("CLUSTER SLOTS: port {} out of range", port));
  }
  node.port = static_cast<int>(port);
  if (r->elements >= 3) node.id = std::string(text_of(r->element[2]));
  return node;
}

}  // namespace

std::optional<Redirect> parse_redirect(std::string_view error) {
  Redirect redirect;
  if (error.starts_with("MOVED ")) {
    redirect.kind = Redirect::Kind::kMoved;
    error.remove_prefix(6);
  } else if (error.starts_with("ASK ")) {
    redirect.kind = Redirect::Kind::kAsk;
    error.remove_prefix(4);
  } else {
    return std::nullopt;
  }
  const size_t space = error.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const std::optional<uint32_t> slot = parse_number<uint32_t>(error.substr(0, space));
  if (!slot || *slot >= kClusterSlots) return std::nullopt;
  const std::optional<ClusterNode> node = parse_address(error.substr(space + 1));
  if (!node) return std::nullopt;
  redirect.slot = *slot;
  redirect.node = *node;
  return redirect;
}

SlotMap SlotMap::from_cluster_slots(const redisReply* reply, std::string_view asked_host) {
  if (!reply || reply->type != REDIS_REPLY_ARRAY) {
    throw std::invalid_argument("CLUSTER SLOTS: the reply is not an array");
  }
  SlotMap map;
  for (size_t i = 0; i < reply->elements; ++i) {
    const redisReply* r = reply->element[i];
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER) {
      throw std::invalid_argument("CLUSTER SLOTS: a range is not [first, last, primary, ...]");
    }
    const long long first = r->element[0]->integer;
    const long long last = r->element[1]->integer;
    if (first < 0 || last < first || last >= kClusterSlots) {
      throw std::invalid_argument(fmt::format("CLUSTER SLOTS: bad range {}-{}", first, last));
    }
    Range range{static_cast<uint32_t>(first),
                static_cast<uint32_t>(last),
                node_of(r->element[2], asked_host),
                {}};
    for (size_t k = 3; k < r->elements; ++k) {
      range.replicas.push_back(node_of(r->element[k], asked_host));
    }
    map.ranges_.push_back(std::move(range));
  }
  std::sort(map.ranges_.begin(), map.ranges_.end(),
            [](const Range& a, const Range& b) { return a.first < b.first; });
  for (size_t i = 1; i < map.ranges_.size(); ++i) {
    if (map.ranges_[i].first <= map.ranges_[i - 1].last) {
      throw std::invalid_argument(fmt::format("CLUSTER SLOTS: ranges {}-{} and {}-{} overlap",
                                              map.ranges_[i - 1].first, map.ranges_[i - 1].last,
                                              map.ranges_[i].first, map.ranges_[i].last));
    }
  }
  return map;
}

const SlotMap::Range* SlotMap::find(uint32_t slot) const {
  const auto it = std::upper_bound(ranges_.begin(), ranges_.end(), slot,
                                   [](uint32_t s, const Range& r) { return s < r.first; });
  if (it == ranges_.begin()) return nullptr;
  const Range& range = *std::prev(it);
  return slot <= range.last ? &range : nullptr;
}

uint32_t SlotMap::uncovered_slots() const {
  uint32_t covered = 0;
  for (const Range& r : ranges_) covered += r.last - r.first + 1;
  return kClusterSlots - covered;
}

std::vector<ClusterNode> SlotMap::primaries() const {
  std::vector<ClusterNode> out;
  for (const Range& r : ranges_) {
    if (std::find(out.begin(), out.end(), r.primary) == out.end()) out.push_back(r.primary);
  }
  return out;
}

bool must_retry_reply(std::string_view error) {
  return parse_redirect(error).has_value() || is_transient_reply(error);
}

}  // namespace dsfs::store
