#include "prefetch/object_data.h"

#include <stdexcept>
#include <utility>

namespace dsfs::prefetch {

ObjectData::ObjectData(std::string bytes) : owned_(std::move(bytes)), bytes_(owned_) {}

ObjectData::ObjectData(store::Reply reply) : reply_(std::move(reply)) {
  if (!reply_.is_string()) throw std::invalid_argument("ObjectData needs a string reply");
  bytes_ = reply_.str();
}

}  // namespace dsfs::prefetch
