#pragma once
// Template body of dsfs::store::pipeline (included by connection.h).
#include <algorithm>

namespace dsfs::store {

template <typename Commands, typename OnReply>
void pipeline(Connection& conn, const Commands& commands, size_t window, OnReply&& on_reply) {
  window = std::max<size_t>(window, 1);
  size_t sent = 0;
  size_t received = 0;
  const size_t total = std::size(commands);
  while (received < total) {
    while (sent < total && sent - received < window) {
      const auto& argv = commands[sent];
      std::vector<std::string_view> views(std::begin(argv), std::end(argv));
      conn.append(std::span<const std::string_view>(views));
      ++sent;
    }
    Reply reply = conn.read_reply();
    on_reply(received, reply);
    ++received;
  }
}

}  // namespace dsfs::store
