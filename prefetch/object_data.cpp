#include "prefetch/object_data.h"

#include <stdexcept>
#include <utility>

namespace dsfs::prefetch {

ObjectData::ObjectData(std::string bytes) : owned_(std::move(bytes)), bytes_(owned_) {}

ObjectData::ObjectData(store::ValueReply value) : value_(std::move(value.bytes)) {
  if (value.kind != store::ValueReply::Kind::kValue) {
    throw std::invalid_argument("ObjectData needs a value reply");
  }
  bytes_ = std::string_view(value_.get(), value.size);
}

ObjectData::ObjectData(store::AlignedValueBuffer block, size_t offset, size_t size)
    : block_(std::move(block)), bytes_(block_.get() + offset, size) {}

}  // namespace dsfs::prefetch
