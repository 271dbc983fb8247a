#include "cuda/view_spec.h"

#include <gtest/gtest.h>

#include <string>

namespace dsfs::view {
namespace {

TEST(ViewSpec, ParsesAFullSpec) {
  const ViewSpec spec =
      parse_view_spec("resize=256,crop=224,dtype=float16,layout=hwc,norm=imagenet");
  EXPECT_EQ(spec.resize.mode, ResizeRule::Mode::kShorterSide);
  EXPECT_EQ(spec.resize.shorter_side, 256);
  EXPECT_EQ(spec.crop_width, 224);
  EXPECT_EQ(spec.crop_height, 224);
  EXPECT_EQ(spec.dtype, DType::kFloat16);
  EXPECT_EQ(spec.layout, Layout::kHWC);
  EXPECT_TRUE(spec.normalize);
  EXPECT_EQ(spec.mean, (std::array<float, 3>{0.485F, 0.456F, 0.406F}));
  EXPECT_EQ(spec.std, (std::array<float, 3>{0.229F, 0.224F, 0.225F}));
  EXPECT_EQ(spec.out_width(), 224);
  EXPECT_EQ(spec.out_height(), 224);
  EXPECT_EQ(spec.tensor_bytes(), 3U * 224 * 224 * 2);
}

TEST(ViewSpec, DefaultsAreFloat32ChwWithoutNorm) {
  const ViewSpec spec = parse_view_spec("resize=256,crop=224");
  EXPECT_EQ(spec.dtype, DType::kFloat32);
  EXPECT_EQ(spec.layout, Layout::kCHW);
  EXPECT_FALSE(spec.normalize);
  EXPECT_EQ(spec.tensor_bytes(), 3U * 224 * 224 * 4);
  EXPECT_EQ(spec.canonical(), "resize=256,crop=224,dtype=float32,layout=chw,norm=none");
}

TEST(ViewSpec, KeyOrderDoesNotMatter) {
  EXPECT_EQ(parse_view_spec("norm=imagenet,layout=chw,dtype=float32,crop=224,resize=256"),
            parse_view_spec("resize=256,crop=224,norm=imagenet"));
}

TEST(ViewSpec, ExactResizeNeedsNoCrop) {
  const ViewSpec spec = parse_view_spec("resize=320x240,dtype=uint8");
  EXPECT_EQ(spec.resize.mode, ResizeRule::Mode::kExact);
  EXPECT_EQ(spec.resize.width, 320);
  EXPECT_EQ(spec.resize.height, 240);
  EXPECT_EQ(spec.crop_width, 0);
  EXPECT_EQ(spec.out_width(), 320);
  EXPECT_EQ(spec.out_height(), 240);
  EXPECT_EQ(spec.tensor_bytes(), 3U * 320 * 240);
  EXPECT_EQ(spec.canonical(), "resize=320x240,dtype=uint8,layout=chw,norm=none");
}

TEST(ViewSpec, RectangularCropAndExactResize) {
  const ViewSpec spec = parse_view_spec("resize=300x200,crop=100x50");
  EXPECT_EQ(spec.out_width(), 100);
  EXPECT_EQ(spec.out_height(), 50);
  EXPECT_EQ(spec.canonical(), "resize=300x200,crop=100x50,dtype=float32,layout=chw,norm=none");
  // A square WxH resize stays an exact resize; a square WxH crop is written as one number.
  EXPECT_EQ(parse_view_spec("resize=256x256,crop=224x224").canonical(),
            "resize=256x256,crop=224,dtype=float32,layout=chw,norm=none");
}

TEST(ViewSpec, CropAloneIsAShape) {
  const ViewSpec spec = parse_view_spec("crop=64");
  EXPECT_EQ(spec.resize.mode, ResizeRule::Mode::kNone);
  EXPECT_EQ(spec.out_width(), 64);
  EXPECT_EQ(spec.canonical(), "crop=64,dtype=float32,layout=chw,norm=none");
}

TEST(ViewSpec, SizeLimits) {
  EXPECT_EQ(parse_view_spec("crop=1").out_width(), 1);
  EXPECT_EQ(parse_view_spec("crop=8192x1").out_width(), 8192);
  EXPECT_EQ(parse_view_spec("resize=8192,crop=1").resize.shorter_side, 8192);
  EXPECT_THROW(parse_view_spec("crop=8193"), SpecError);
  EXPECT_THROW(parse_view_spec("resize=8193,crop=1"), SpecError);
}

TEST(ViewSpec, ExplicitNorm) {
  const ViewSpec spec = parse_view_spec("crop=8,norm=0.5:0.25:-1:2:0.125:3e-2");
  EXPECT_TRUE(spec.normalize);
  EXPECT_EQ(spec.mean, (std::array<float, 3>{0.5F, 0.25F, -1.0F}));
  EXPECT_EQ(spec.std, (std::array<float, 3>{2.0F, 0.125F, 0.03F}));
  EXPECT_EQ(spec.canonical(), "crop=8,dtype=float32,layout=chw,norm=0.5:0.25:-1:2:0.125:0.03");
}

TEST(ViewSpec, ExplicitImagenetNumbersAreTheImagenetPreset) {
  const ViewSpec spec = parse_view_spec("crop=8,norm=0.485:0.456:0.406:0.229:0.224:0.225");
  EXPECT_EQ(spec, parse_view_spec("crop=8,norm=imagenet"));
  EXPECT_EQ(spec.canonical(), "crop=8,dtype=float32,layout=chw,norm=imagenet");
}

TEST(ViewSpec, IdentityNormIsNoNorm) {
  const ViewSpec spec = parse_view_spec("crop=8,norm=0:-0:0:1:1:1.0");
  EXPECT_FALSE(spec.normalize);
  EXPECT_EQ(spec, parse_view_spec("crop=8"));
  EXPECT_EQ(spec.canonical(), "crop=8,dtype=float32,layout=chw,norm=none");
  // Without normalization uint8 is fine.
  EXPECT_EQ(parse_view_spec("crop=8,dtype=uint8,norm=0:0:0:1:1:1").dtype, DType::kUint8);
  EXPECT_EQ(parse_view_spec("crop=8,dtype=uint8,norm=none").dtype, DType::kUint8);
}

TEST(ViewSpec, CanonicalRoundTrips) {
  const char* texts[] = {
      "imagenet-eval",
      "imagenet-eval-fp16",
      "imagenet-eval-uint8",
      "resize=256,crop=224",
      "crop=224,resize=256,layout=hwc,dtype=uint8",
      "resize=1x8192,crop=7x3,dtype=float16,norm=imagenet",
      "crop=5,norm=0.1:0.2:0.3:0.7:0.8:0.9",
      "crop=5,norm=1e-7:123456.789:-3.4e38:1e-30:3.3e38:0.3333333333333333",
      "crop=5,norm=0.1000000015:0.2:0.3:0.7:0.8:0.9",
  };
  for (const char* text : texts) {
    SCOPED_TRACE(text);
    const ViewSpec spec = parse_view_spec(text);
    const std::string canonical = spec.canonical();
    EXPECT_EQ(parse_view_spec(canonical), spec) << canonical;
    EXPECT_EQ(parse_view_spec(canonical).canonical(), canonical);
  }
}

TEST(ViewSpec, CanonicalHoldsOnlyPathSafeCharacters) {
  const std::string canonical = parse_view_spec("crop=5,norm=-1e-7:2:3:4:5:6").canonical();
  EXPECT_EQ(canonical.find('/'), std::string::npos);
  EXPECT_EQ(canonical.find(' '), std::string::npos);
}

TEST(ViewSpec, Presets) {
  const auto& presets = view_presets();
  ASSERT_GE(presets.size(), 1U);
  EXPECT_EQ(presets.front().first, "imagenet-eval");
  for (const auto& [name, text] : presets) {
    SCOPED_TRACE(name);
    EXPECT_EQ(name.find_first_of("=,/ "), std::string::npos);
    EXPECT_EQ(parse_view_spec(name), parse_view_spec(text));
  }
  const ViewSpec eval = parse_view_spec("imagenet-eval");
  EXPECT_EQ(eval.canonical(), "resize=256,crop=224,dtype=float32,layout=chw,norm=imagenet");
  EXPECT_EQ(eval.tensor_bytes(), 602112U);
  EXPECT_EQ(parse_view_spec("imagenet-eval-fp16").dtype, DType::kFloat16);
  const ViewSpec raw = parse_view_spec("imagenet-eval-uint8");
  EXPECT_EQ(raw.dtype, DType::kUint8);
  EXPECT_EQ(raw.layout, Layout::kHWC);
  EXPECT_FALSE(raw.normalize);
}

struct InvalidSpec {
  const char* text;
  const char* message_part;  // what the error must mention
};

class InvalidViewSpec : public testing::TestWithParam<InvalidSpec> {};

TEST_P(InvalidViewSpec, IsRefusedWithAReason) {
  const InvalidSpec& invalid = GetParam();
  try {
    const ViewSpec spec = parse_view_spec(invalid.text);
    FAIL() << "accepted, canonical " << spec.canonical();
  } catch (const SpecError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(invalid.message_part), std::string::npos) << message;
    EXPECT_NE(message.find("view spec"), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Forms, InvalidViewSpec,
    testing::Values(
        // Structure.
        InvalidSpec{"", "empty"}, InvalidSpec{",", "empty item"},
        InvalidSpec{"resize=256,crop=224,", "empty item"},
        InvalidSpec{",resize=256,crop=224", "empty item"},
        InvalidSpec{"resize=256,,crop=224", "empty item"},
        InvalidSpec{"resize=256 ,crop=224", "not allowed"},
        InvalidSpec{" resize=256,crop=224", "not allowed"},
        InvalidSpec{"resize=256,crop=224\n", "not allowed"},
        InvalidSpec{"resize=256,\tcrop=224", "not allowed"},
        InvalidSpec{"resize=256,crop=224/", "not allowed"},
        InvalidSpec{"resize=256,crop=22\xc3\xa4", "not allowed"},
        InvalidSpec{"crop", "not key=value"}, InvalidSpec{"imagenet-evall", "not key=value"},
        InvalidSpec{"IMAGENET-EVAL", "not key=value"}, InvalidSpec{"=224", "unknown key"},
        InvalidSpec{"bogus=1,crop=224", "unknown key \"bogus\""},
        InvalidSpec{"Resize=256,crop=224", "unknown key"},
        // Duplicates and empty values.
        InvalidSpec{"resize=256,resize=256,crop=224", "resize: given more than once"},
        InvalidSpec{"crop=224,dtype=float32,dtype=float16", "dtype: given more than once"},
        InvalidSpec{"crop=224,crop=224", "crop: given more than once"},
        InvalidSpec{"resize=,crop=224", "resize: empty value"},
        InvalidSpec{"crop=", "crop: empty value"},
        InvalidSpec{"crop=224,dtype=", "dtype: empty value"},
        InvalidSpec{"crop=224,layout=", "layout: empty value"},
        InvalidSpec{"crop=224,norm=", "norm: empty value"},
        // Sizes.
        InvalidSpec{"resize=abc,crop=224", "resize: \"abc\" is not a size"},
        InvalidSpec{"resize=0,crop=224", "out of range"},
        InvalidSpec{"resize=-5,crop=224", "out of range"},
        InvalidSpec{"resize=+5,crop=224", "not a size"},
        InvalidSpec{"resize=8193,crop=224", "out of range"},
        InvalidSpec{"resize=99999999999999999999,crop=224", "resize"},
        InvalidSpec{"resize=2.5,crop=224", "not a size"},
        InvalidSpec{"resize=256x,crop=224", "not a size"},
        InvalidSpec{"resize=x256,crop=224", "not a size"},
        InvalidSpec{"resize=2x3x4", "not a size"}, InvalidSpec{"resize=256X256", "not a size"},
        InvalidSpec{"crop=0", "crop: 0 is out of range"}, InvalidSpec{"crop=224x0", "out of range"},
        InvalidSpec{"crop=0x0", "out of range"}, InvalidSpec{"crop=1e3", "not a size"},
        // The shape must follow from the spec.
        InvalidSpec{"resize=256", "tensor shape"},
        InvalidSpec{"dtype=float32,resize=256", "tensor shape"},
        InvalidSpec{"dtype=uint8", "tensor shape"},
        // dtype, layout, norm.
        InvalidSpec{"crop=224,dtype=int8", "dtype: \"int8\""},
        InvalidSpec{"crop=224,dtype=Float32", "dtype"},
        InvalidSpec{"crop=224,layout=nchw", "layout: \"nchw\""},
        InvalidSpec{"crop=224,norm=imagenet2", "norm"},
        InvalidSpec{"crop=224,norm=1:2:3:4:5", "not six"},
        InvalidSpec{"crop=224,norm=1:2:3:4:5:6:7", "more than six"},
        InvalidSpec{"crop=224,norm=1:2:3:0:1:1", "greater than 0"},
        InvalidSpec{"crop=224,norm=1:2:3:-1:1:1", "greater than 0"},
        InvalidSpec{"crop=224,norm=0:0:0:1e-50:1:1", "greater than 0"},
        InvalidSpec{"crop=224,norm=1e40:0:0:1:1:1", "float32"},
        InvalidSpec{"crop=224,norm=nan:0:0:1:1:1", "finite"},
        InvalidSpec{"crop=224,norm=0:0:0:inf:1:1", "finite"},
        InvalidSpec{"crop=224,norm=a:b:c:d:e:f", "norm"},
        InvalidSpec{"crop=224,norm=1::2:3:4:5:6", "norm"},
        InvalidSpec{"crop=224,norm=0:0:0:1:1:1:", "norm"},
        InvalidSpec{"crop=224,norm=+1:0:0:1:1:1", "norm"},
        InvalidSpec{"crop=224,dtype=uint8,norm=imagenet", "uint8"},
        InvalidSpec{"crop=224,norm=0.1:0.1:0.1:1:1:1,dtype=uint8", "uint8"}));

}  // namespace
}  // namespace dsfs::view
