#pragma once
// Template body of Client::pipeline (included by client.h).
#include <iterator>

namespace dsfs::store {

template <typename Commands, typename OnReply>
void Client::pipeline(const Commands& commands, size_t window, OnReply&& on_reply) {
  std::vector<std::vector<std::string_view>> views;
  views.reserve(std::size(commands));
  for (const auto& argv : commands) views.emplace_back(std::begin(argv), std::end(argv));
  pipeline_views(views, window, [&](size_t index, Reply& reply) { on_reply(index, reply); });
}

}  // namespace dsfs::store
