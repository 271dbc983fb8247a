#include "cuda/npy.h"

#include <fmt/format.h>

namespace dsfs::view {
namespace {

// numpy aligns the data that follows the header to 64 bytes so it can be memory-mapped.
constexpr std::size_t kAlignment = 64;
constexpr std::string_view kMagic{"\x93NUMPY\x01\x00", 8};  // format version 1.0

std::string_view descr(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return "|u1";
    case DType::kFloat16:
      return "<f2";
    case DType::kFloat32:
      return "<f4";
  }
  return "|u1";
}

}  // namespace

std::string npy_header(const ViewSpec& spec) {
  const int height = spec.out_height();
  const int width = spec.out_width();
  const std::string shape = spec.layout == Layout::kCHW ? fmt::format("(3, {}, {})", height, width)
                                                        : fmt::format("({}, {}, 3)", height, width);
  // The dict exactly as numpy.save writes it, then spaces and '\n' up to the alignment.
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                 descr(spec.dtype), shape);
  const std::size_t unpadded = kMagic.size() + 2 + dict.size() + 1;
  dict.append((kAlignment - unpadded % kAlignment) % kAlignment, ' ');
  dict.push_back('\n');

  const std::size_t header_len = dict.size();  // well under 65535 for any valid spec
  std::string header(kMagic);
  header.push_back(static_cast<char>(header_len & 0xFF));
  header.push_back(static_cast<char>((header_len >> 8) & 0xFF));
  header += dict;
  return header;
}

std::uint64_t npy_file_size(const ViewSpec& spec) {
  return npy_header(spec).size() + spec.tensor_bytes();
}

}  // namespace dsfs::view
