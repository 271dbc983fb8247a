#pragma once
// Redis Cluster's key space, as a client routes it: 16384 hash slots, a key's slot from the
// CRC16 of its hash tag, the slot map a node reports (CLUSTER SLOTS) and the redirections a node
// answers with (MOVED, ASK). Pure logic over replies; the client that uses it (issue 12) is
// built on top.
#include <hiredis/hiredis.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dsfs::store {

inline constexpr uint32_t kClusterSlots = 16384;

// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes
// keys with.
uint16_t crc16(std::string_view bytes);

// The part of `key` that decides its slot: the bytes between the first '{' and the first '}'
// after it when there is at least one, else the whole key. dsfs puts a dataset's metadata keys
// under one tag ({NAME}) so they share a slot, and leaves object keys untagged.
std::string_view hash_tag(std::string_view key);

// The slot of `key`: crc16(hash_tag(key)) mod 16384.
uint32_t key_slot(std::string_view key);

// A node's address as the cluster reports it.
struct ClusterNode {
  std::string host;
  int port = 0;
  std::string id;  // empty when not reported
  bool operator==(const ClusterNode&) const = default;
};

// An error reply that sends the command elsewhere: "MOVED <slot> <host>:<port>" (the slot lives
// there now: refresh the map) or "ASK <slot> <host>:<port>" (ask there once, after ASKING).
struct Redirect {
  enum class Kind { kMoved, kAsk };
  Kind kind = Kind::kMoved;
  uint32_t slot = 0;
  ClusterNode node;
};
// nullopt for any other error text (including a malformed redirection).
std::optional<Redirect> parse_redirect(std::string_view error);

// An error reply that a later try (elsewhere, or after a wait) will settle: a redirection
// (MOVED/ASK) or a "not now" (errors.h is_transient_reply: TRYAGAIN, CLUSTERDOWN, LOADING...).
bool must_retry_reply(std::string_view error);

// Which node serves each slot, from CLUSTER SLOTS.
// Thread safety: immutable once built; share it by const reference or shared_ptr.
class SlotMap {
 public:
  struct Range {
    uint32_t first = 0;
    uint32_t last = 0;  // inclusive
    ClusterNode primary;
    std::vector<ClusterNode> replicas;
  };

  // Parses a CLUSTER SLOTS reply. A node reported with no endpoint (an empty string, or "?"
  // when the node does not know its own) is `asked_host`, the host the reply came from.
  // Throws std::invalid_argument naming what is malformed.
  static SlotMap from_cluster_slots(const redisReply* reply, std::string_view asked_host);

  // The range holding `slot`; nullptr when no node serves it (the cluster is not fully covered).
  const Range* find(uint32_t slot) const;
  const std::vector<Range>& ranges() const { return ranges_; }
  // Slots no range covers (0: every slot is served).
  uint32_t uncovered_slots() const;
  // Every primary, once each, in slot order.
  std::vector<ClusterNode> primaries() const;

 private:
  std::vector<Range> ranges_;  // sorted by first, not overlapping
};

}  // namespace dsfs::store
