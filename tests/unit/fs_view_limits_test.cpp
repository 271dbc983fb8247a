// A SPEC whose .npy files could not stay in the view cache is refused when its directory is
// looked up (with the SPEC, the sizes and what to do in the reason), presets included, and takes
// no slot; the reason carries the SPEC's bytes escaped.
#include <gtest/gtest.h>

#include <string>

#include "cuda/npy.h"
#include "cuda/view_spec.h"
#include "fs/views.h"

namespace dsfs::fs {
namespace {

TEST(ViewSpecSizeLimit, ASpecWhoseFilesExceedTheLimitIsRefusedWithTheReason) {
  ViewRegistry registry(ViewRegistry::kMaxSlots, /*max_file_bytes=*/1 << 20);
  const uint32_t before = registry.size();
  // 8192 x 8192 float32: 805 MB a file.
  const ViewRegistry::Found huge = registry.find_or_add("resize=8192,crop=8192");
  ASSERT_FALSE(huge.slot);
  EXPECT_NE(huge.error.find("resize=8192,crop=8192"), std::string::npos) << huge.error;
  EXPECT_NE(huge.error.find("805306496 bytes"), std::string::npos) << huge.error;
  EXPECT_NE(huge.error.find("1048576 bytes"), std::string::npos) << huge.error;
  EXPECT_NE(huge.error.find("--view-cache-size"), std::string::npos) << huge.error;
  EXPECT_EQ(registry.size(), before) << "a refused SPEC takes no slot";
  // Just under the limit is fine; just over is not.
  EXPECT_TRUE(registry.find_or_add("crop=295,dtype=float32").slot);  // 3*295*295*4 + header
  EXPECT_FALSE(registry.find_or_add("crop=296,dtype=float32").slot);
  EXPECT_TRUE(registry.find_or_add("imagenet-eval").slot);  // 602 KB
}

TEST(ViewSpecSizeLimit, PresetsOverTheLimitAreRefusedToo) {
  ViewRegistry registry(ViewRegistry::kMaxSlots, /*max_file_bytes=*/200 << 10);
  const ViewRegistry::Found preset = registry.find_or_add("imagenet-eval");
  EXPECT_FALSE(preset.slot);
  EXPECT_NE(preset.error.find("imagenet-eval"), std::string::npos) << preset.error;
  EXPECT_TRUE(registry.find_or_add("imagenet-eval-uint8").slot);  // 150 KB
}

TEST(ViewSpecSizeLimit, ViewFilesTakeHalfTheViewCache) {
  EXPECT_EQ(ViewFiles::kMaxViewFileShare, 2u);
  const view::ViewSpec spec = view::parse_view_spec("crop=295,dtype=float32");
  EXPECT_LE(view::npy_file_size(spec), uint64_t{1} << 20);
  EXPECT_GT(view::npy_file_size(view::parse_view_spec("crop=296,dtype=float32")),
            uint64_t{1} << 20);
}

TEST(ViewSpecErrors, TheSpecInAnErrorIsEscaped) {
  ViewRegistry registry;
  const ViewRegistry::Found bad = registry.find_or_add("crop=2\x1b[2J\x07");
  ASSERT_FALSE(bad.slot);
  EXPECT_EQ(bad.error.find('\x1b'), std::string::npos) << bad.error;
  EXPECT_EQ(bad.error.find('\x07'), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("\\x1b[2J\\x07"), std::string::npos) << bad.error;
}

}  // namespace
}  // namespace dsfs::fs
