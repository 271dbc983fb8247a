#include "cuda/npy.h"

#include <gtest/gtest.h>

#include <string>

namespace dsfs::view {
namespace {

// The header read back the way numpy's format.read_array_header_1_0 does.
struct ParsedHeader {
  int major = -1;
  int minor = -1;
  std::size_t header_len = 0;
  std::string dict;  // without the padding and '\n'
  std::string descr;
  std::string fortran_order;
  std::string shape;
};

ParsedHeader parse(const std::string& header) {
  ParsedHeader parsed;
  EXPECT_GE(header.size(), 10U);
  EXPECT_EQ(header.substr(0, 6), std::string("\x93NUMPY"));
  parsed.major = static_cast<unsigned char>(header[6]);
  parsed.minor = static_cast<unsigned char>(header[7]);
  parsed.header_len = static_cast<unsigned char>(header[8]) |
                      static_cast<std::size_t>(static_cast<unsigned char>(header[9])) << 8;
  const std::string rest = header.substr(10);
  EXPECT_EQ(rest.size(), parsed.header_len);
  EXPECT_EQ(rest.back(), '\n');
  const auto end = rest.find_last_not_of(" \n");
  parsed.dict = rest.substr(0, end + 1);
  // Only spaces between the dict and the final newline.
  EXPECT_EQ(rest.find_first_not_of(' ', end + 1), rest.size() - 1);
  // {'descr': '<f4', 'fortran_order': False, 'shape': (3, 224, 224), }
  const std::string descr_key = "{'descr': '";
  const std::string order_key = "', 'fortran_order': ";
  const std::string shape_key = ", 'shape': ";
  const std::string tail = ", }";
  const auto order_at = parsed.dict.find(order_key);
  const auto shape_at = parsed.dict.find(shape_key);
  const bool well_formed = parsed.dict.starts_with(descr_key) && parsed.dict.ends_with(tail) &&
                           order_at != std::string::npos && shape_at != std::string::npos &&
                           order_at < shape_at;
  EXPECT_TRUE(well_formed) << parsed.dict;
  if (!well_formed) return parsed;
  parsed.descr = parsed.dict.substr(descr_key.size(), order_at - descr_key.size());
  const auto order_begin = order_at + order_key.size();
  parsed.fortran_order = parsed.dict.substr(order_begin, shape_at - order_begin);
  const auto shape_begin = shape_at + shape_key.size();
  parsed.shape = parsed.dict.substr(shape_begin, parsed.dict.size() - tail.size() - shape_begin);
  return parsed;
}

TEST(NpyHeader, ImagenetEvalIsNumpysOwnHeader) {
  const std::string header = npy_header(parse_view_spec("imagenet-eval"));
  // Byte for byte what numpy 1.24's np.save writes for a (3, 224, 224) float32 array.
  std::string expected("\x93NUMPY\x01\x00\x76\x00", 10);
  expected += "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 224, 224), }";
  expected.append(128 - expected.size() - 1, ' ');
  expected += '\n';
  EXPECT_EQ(header, expected);
  EXPECT_EQ(header.size(), 128U);
}

TEST(NpyHeader, DescrAndShapeFollowTheSpec) {
  struct Case {
    const char* spec;
    const char* descr;
    const char* shape;
  };
  const Case cases[] = {
      {"resize=256,crop=224,dtype=float32", "<f4", "(3, 224, 224)"},
      {"resize=256,crop=224,dtype=float16", "<f2", "(3, 224, 224)"},
      {"resize=256,crop=224,dtype=uint8", "|u1", "(3, 224, 224)"},
      {"resize=256,crop=224,dtype=uint8,layout=hwc", "|u1", "(224, 224, 3)"},
      {"resize=640x480,layout=hwc", "<f4", "(480, 640, 3)"},
      {"resize=640x480", "<f4", "(3, 480, 640)"},
      {"crop=7x5,dtype=float16", "<f2", "(3, 5, 7)"},
      {"crop=8192,dtype=float16,layout=hwc", "<f2", "(8192, 8192, 3)"},
      {"crop=1", "<f4", "(3, 1, 1)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec);
    const ViewSpec spec = parse_view_spec(c.spec);
    const std::string header = npy_header(spec);
    const ParsedHeader parsed = parse(header);
    EXPECT_EQ(parsed.major, 1);
    EXPECT_EQ(parsed.minor, 0);
    EXPECT_EQ(header.size() % 64, 0U);
    EXPECT_EQ(parsed.descr, c.descr);
    EXPECT_EQ(parsed.fortran_order, "False");
    EXPECT_EQ(parsed.shape, c.shape);
    EXPECT_EQ(npy_file_size(spec), header.size() + spec.tensor_bytes());
  }
}

TEST(NpyHeader, FileSizeOfThePresets) {
  EXPECT_EQ(npy_file_size(parse_view_spec("imagenet-eval")), 128U + 3 * 224 * 224 * 4);
  EXPECT_EQ(npy_file_size(parse_view_spec("imagenet-eval-fp16")), 128U + 3 * 224 * 224 * 2);
  EXPECT_EQ(npy_file_size(parse_view_spec("imagenet-eval-uint8")), 128U + 3 * 224 * 224);
}

}  // namespace
}  // namespace dsfs::view
