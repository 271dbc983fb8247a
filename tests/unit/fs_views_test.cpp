// MOUNT/.views: view inode numbering, the view name mapping, the SPEC registry and its limit, the
// rendering service (inline and batched), and a real in-process mount over a real redis-server
// serving .npy files of real JPEGs.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda/backend.h"
#include "cuda/image_decode.h"
#include "cuda/npy.h"
#include "cuda/view_service.h"
#include "cuda/view_spec.h"
#include "fs/inodes.h"
#include "fs/mount.h"
#include "fs/views.h"
#include "src/catalog/catalog.h"
#include "src/catalog/dataset.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::fs {
namespace {

using test::list_dir;
using test::read_errno;

using namespace std::chrono_literals;
namespace stdfs = std::filesystem;

// ---- inodes ---------------------------------------------------------------------------------

TEST(ViewInodes, RoundTripAtTheLimits) {
  for (const uint32_t slot : {0u, 1u, 4321u, kMaxViewSlots - 1}) {
    const InodeRef spec = decode_inode(view_spec_inode(slot));
    EXPECT_EQ(spec.kind, InodeRef::Kind::kViewSpec);
    EXPECT_EQ(spec.view_slot, slot);
    for (const uint32_t dataset : {0u, 3u, kMaxViewDatasets - 1}) {
      for (const uint32_t entry : {0u, 1u, 777777u, UINT32_MAX}) {
        const uint64_t ino = view_entry_inode(slot, dataset, entry);
        const InodeRef ref = decode_inode(ino);
        EXPECT_EQ(ref.kind, InodeRef::Kind::kViewEntry) << ino;
        EXPECT_EQ(ref.view_slot, slot);
        EXPECT_EQ(ref.dataset, dataset);
        EXPECT_EQ(ref.entry, entry);
        EXPECT_NE(ino, view_spec_inode(slot));
      }
    }
  }
}

TEST(ViewInodes, NeverCollideWithTheOtherRanges) {
  EXPECT_EQ(decode_inode(kViewsDirInode).kind, InodeRef::Kind::kViewsDir);
  // Every view inode has bit 63; entry inodes stay below 2^60, stats snapshots below 2^63.
  EXPECT_LT(entry_inode(kMaxDatasets - 1, UINT32_MAX), kStatsSnapshotBase);
  EXPECT_GE(view_spec_inode(0), kViewInodeFlag);
  EXPECT_EQ(decode_inode(entry_inode(kMaxDatasets - 1, UINT32_MAX)).kind, InodeRef::Kind::kEntry);
  EXPECT_EQ(decode_inode(kViewInodeFlag - 1).kind, InodeRef::Kind::kStatsSnapshot);
  // A spec directory has entry 0 and no dataset; anything else without a dataset names nothing.
  EXPECT_EQ(decode_inode(view_spec_inode(2) | 5).kind, InodeRef::Kind::kInvalid);
  // Slots past the registry's bound name nothing, whatever the other fields say.
  EXPECT_EQ(decode_inode(view_spec_inode(kMaxViewSlots)).kind, InodeRef::Kind::kInvalid);
  EXPECT_EQ(decode_inode(view_entry_inode(kMaxViewSlots, 0, 0)).kind, InodeRef::Kind::kInvalid);
  EXPECT_EQ(decode_inode(UINT64_MAX).kind, InodeRef::Kind::kInvalid);
}

// ---- names ----------------------------------------------------------------------------------

TEST(ViewNames, ImagesByExtensionInAnyCase) {
  for (const char* name : {"a.jpg", "n01440764_10026.JPEG", "x.Jpeg", "p.png", "P.PNG", "..jpg",
                           "dots.in.name.jpeg"}) {
    EXPECT_TRUE(is_image_name(name)) << name;
  }
  for (const char* name :
       {".jpg", "jpg", "a.jpgx", "a.gif", "a.txt", "a.npy", "", "a.jp g", "a.jpeg.txt"}) {
    EXPECT_FALSE(is_image_name(name)) << name;
  }
}

TEST(ViewNames, NpyNamesMapBackToImagesOnly) {
  EXPECT_EQ(view_file_name("x.JPEG"), "x.JPEG.npy");
  EXPECT_EQ(view_source_name("x.JPEG.npy"), "x.JPEG");
  EXPECT_EQ(view_source_name("a b.png.npy"), "a b.png");
  EXPECT_EQ(view_source_name("x.JPEG"), std::nullopt);
  EXPECT_EQ(view_source_name("x.txt.npy"), std::nullopt);
  EXPECT_EQ(view_source_name("x.npy"), std::nullopt);
  EXPECT_EQ(view_source_name(".jpg.npy"), std::nullopt);
  EXPECT_EQ(view_source_name("x.JPEG.NPY"), std::nullopt);
  EXPECT_EQ(view_source_name(".npy"), std::nullopt);
}

// ---- registry -------------------------------------------------------------------------------

TEST(ViewRegistryTest, PresetsComeFirstAndKeepTheirSlots) {
  ViewRegistry registry;
  const auto& presets = view::view_presets();
  ASSERT_EQ(registry.preset_count(), presets.size());
  ASSERT_GE(presets.size(), 1u);
  for (uint32_t i = 0; i < presets.size(); ++i) {
    const ViewRegistry::Slot* slot = registry.slot(i);
    ASSERT_NE(slot, nullptr);
    EXPECT_EQ(slot->name, presets[i].first);
    EXPECT_EQ(slot->canonical, i);
    EXPECT_EQ(slot->header, view::npy_header(slot->spec));
    EXPECT_EQ(slot->file_size, view::npy_file_size(slot->spec));
    EXPECT_EQ(registry.find_or_add(presets[i].first).slot, i);
  }
  EXPECT_EQ(registry.slot(registry.size()), nullptr);
  EXPECT_EQ(registry.size(), presets.size());  // finding presets adds nothing
}

TEST(ViewRegistryTest, SpellingsOfOneSpecGetTheirOwnSlotAndShareTheCanonicalOne) {
  ViewRegistry registry;
  const uint32_t presets = registry.preset_count();
  const auto eval = registry.find_or_add("imagenet-eval");
  ASSERT_TRUE(eval.slot);
  const auto spelled = registry.find_or_add("crop=224,resize=256,norm=imagenet");
  ASSERT_TRUE(spelled.slot) << spelled.error;
  EXPECT_EQ(*spelled.slot, presets);
  EXPECT_EQ(registry.slot(*spelled.slot)->canonical, *eval.slot);
  EXPECT_EQ(registry.slot(*spelled.slot)->name, "crop=224,resize=256,norm=imagenet");
  // The same spelling again is the same slot; a new spec is its own canonical slot.
  EXPECT_EQ(registry.find_or_add("crop=224,resize=256,norm=imagenet").slot, spelled.slot);
  const auto small = registry.find_or_add("resize=64,crop=32,dtype=uint8,layout=hwc");
  ASSERT_TRUE(small.slot) << small.error;
  EXPECT_EQ(registry.slot(*small.slot)->canonical, *small.slot);
  EXPECT_EQ(registry.slot(*small.slot)->file_size, 128u + 32 * 32 * 3);
  EXPECT_EQ(registry.size(), presets + 2);
}

TEST(ViewRegistryTest, InvalidSpecsSayWhyAndTakeNoSlot) {
  ViewRegistry registry;
  for (const char* name : {"resize=256", "dtype=float64,crop=3", "foo", "crop=0", "crop=224,crop=2",
                           "crop=224,dtype=uint8,norm=imagenet"}) {
    const auto found = registry.find_or_add(name);
    EXPECT_FALSE(found.slot) << name;
    EXPECT_NE(found.error.find(name), std::string::npos) << found.error;
  }
  EXPECT_EQ(registry.size(), registry.preset_count());
}

TEST(ViewRegistryTest, RefusesNewSpellingsOnceFullButKeepsServingTheOldOnes) {
  ViewRegistry registry(static_cast<uint32_t>(view::view_presets().size()) + 2);
  ASSERT_TRUE(registry.find_or_add("crop=10").slot);
  ASSERT_TRUE(registry.find_or_add("crop=11").slot);
  const auto refused = registry.find_or_add("crop=12");
  EXPECT_FALSE(refused.slot);
  EXPECT_NE(refused.error.find("limit"), std::string::npos) << refused.error;
  EXPECT_FALSE(registry.find_or_add("crop=10,dtype=float32").slot);  // a new spelling: refused
  EXPECT_TRUE(registry.find_or_add("crop=10").slot);
  EXPECT_TRUE(registry.find_or_add("imagenet-eval").slot);
  EXPECT_EQ(registry.size(), registry.max_slots());
}

TEST(ViewRegistryTest, ConcurrentFirstLookupsOfOneNameGetOneSlot) {
  ViewRegistry registry;
  std::vector<std::optional<uint32_t>> found(8);
  {
    std::vector<std::jthread> threads;
    for (size_t i = 0; i < found.size(); ++i) {
      threads.emplace_back([&, i] {
        for (int round = 0; round < 50; ++round) {
          found[i] = registry.find_or_add(fmt::format("crop={}", 100 + round)).slot;
        }
      });
    }
  }
  for (const auto& slot : found) EXPECT_EQ(slot, found.front());
  EXPECT_EQ(registry.size(), registry.preset_count() + 50);
}

// ---- images ---------------------------------------------------------------------------------

// A JPEG of smooth gradients (quality 90), as a photo would be.
std::string make_jpeg(int width, int height, unsigned seed) {
  std::mt19937 random(seed);
  std::vector<unsigned char> pixels(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      unsigned char* p = &pixels[(static_cast<size_t>(y) * width + x) * 3];
      p[0] = static_cast<unsigned char>(255 * x / std::max(width - 1, 1));
      p[1] = static_cast<unsigned char>(255 * y / std::max(height - 1, 1));
      p[2] = static_cast<unsigned char>((x * 7 + y * 3 + random() % 16) & 0xFF);
    }
  }
  tjhandle handle = tjInitCompress();
  EXPECT_NE(handle, nullptr);
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int result = tjCompress2(handle, pixels.data(), width, 0, height, TJPF_RGB, &jpeg, &size,
                                 TJSAMP_420, 90, 0);
  EXPECT_EQ(result, 0) << tjGetErrorStr2(handle);
  std::string bytes(reinterpret_cast<const char*>(jpeg), size);
  tjFree(jpeg);
  tjDestroy(handle);
  return bytes;
}

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

// What MOUNT/.views must hold for `encoded`: header, then the CPU backend's tensor.
std::string expected_npy(const view::ViewSpec& spec, const std::string& encoded) {
  const view::RgbImage image = view::decode_image(as_bytes(encoded));
  std::string file = view::npy_header(spec);
  std::vector<std::byte> tensor(spec.tensor_bytes());
  const view::RgbImage* images[] = {&image};
  const std::span<std::byte> outputs[] = {tensor};
  view::make_cpu_backend()->transform(spec, images, outputs);
  file.append(reinterpret_cast<const char*>(tensor.data()), tensor.size());
  return file;
}

// ---- the service ----------------------------------------------------------------------------

TEST(ViewServiceTest, RendersHeaderThenTensorInline) {
  view::ViewService service(view::make_cpu_backend(), {.batched = false});
  EXPECT_FALSE(service.batched());
  EXPECT_EQ(service.backend_name(), "cpu");
  const view::ViewSpec spec = view::parse_view_spec("resize=40,crop=32,dtype=float16");
  const std::string jpeg = make_jpeg(80, 60, 1);
  EXPECT_EQ(service.render(spec, as_bytes(jpeg)), expected_npy(spec, jpeg));
  EXPECT_THROW(service.render(spec, as_bytes(std::string("\xff\xd8 not a jpeg"))),
               view::DecodeError);
  const view::ViewServiceStats stats = service.stats();
  EXPECT_EQ(stats.rendered, 1u);
  EXPECT_EQ(stats.decode_errors, 1u);
  EXPECT_EQ(stats.batches, 0u);
}

// Records each batch it is given, then transforms with the CPU backend (or throws).
class RecordingBackend : public view::Backend {
 public:
  std::string_view name() const override { return "recording"; }
  void transform(const view::ViewSpec& spec, std::span<const view::RgbImage* const> images,
                 std::span<const std::span<std::byte>> outputs) override {
    {
      std::lock_guard lock(mutex);
      batch_sizes.push_back(images.size());
      batch_specs.push_back(spec.canonical());
    }
    if (fail) throw std::runtime_error("the device fell over");
    cpu->transform(spec, images, outputs);
  }
  std::unique_ptr<view::Backend> cpu = view::make_cpu_backend();
  std::mutex mutex;
  std::vector<size_t> batch_sizes;
  std::vector<std::string> batch_specs;
  std::atomic<bool> fail{false};
};

TEST(ViewServiceTest, BatchesConcurrentCallersBySpec) {
  auto backend = std::make_unique<RecordingBackend>();
  RecordingBackend& recorder = *backend;
  constexpr size_t kCallers = 6;
  // A window long enough that the batch closes because it is full, never on time.
  view::ViewService service(std::move(backend),
                            {.batched = true, .max_batch = kCallers, .batch_window = 60s});
  ASSERT_TRUE(service.batched());
  const view::ViewSpec spec = view::parse_view_spec("resize=48,crop=40");
  std::vector<std::string> jpegs;
  for (unsigned i = 0; i < kCallers; ++i) {
    jpegs.push_back(make_jpeg(60 + static_cast<int>(i) * 7, 50 + static_cast<int>(i) * 3, i));
  }
  std::vector<std::string> rendered(kCallers);
  {
    std::vector<std::jthread> callers;
    for (size_t i = 0; i < kCallers; ++i) {
      callers.emplace_back([&, i] { rendered[i] = service.render(spec, as_bytes(jpegs[i])); });
    }
  }
  for (size_t i = 0; i < kCallers; ++i) EXPECT_EQ(rendered[i], expected_npy(spec, jpegs[i])) << i;
  EXPECT_EQ(recorder.batch_sizes, std::vector<size_t>{kCallers});
  EXPECT_EQ(service.stats().batches, 1u);
  EXPECT_EQ(service.stats().batched_images, kCallers);
}

TEST(ViewServiceTest, ABatchHoldsOneSpecAndAFailedBatchFailsEachCaller) {
  auto backend = std::make_unique<RecordingBackend>();
  RecordingBackend& recorder = *backend;
  view::ViewService service(std::move(backend),
                            {.batched = true, .max_batch = 4, .batch_window = 2ms});
  const view::ViewSpec a = view::parse_view_spec("crop=16");
  const view::ViewSpec b = view::parse_view_spec("crop=8,dtype=uint8");
  const std::string jpeg = make_jpeg(30, 20, 9);
  std::vector<std::string> rendered(8);
  {
    std::vector<std::jthread> callers;
    for (size_t i = 0; i < rendered.size(); ++i) {
      callers.emplace_back([&, i] { rendered[i] = service.render(i % 2 ? b : a, as_bytes(jpeg)); });
    }
  }
  for (size_t i = 0; i < rendered.size(); ++i) {
    EXPECT_EQ(rendered[i], expected_npy(i % 2 ? b : a, jpeg)) << i;
  }
  size_t images = 0;
  for (const size_t size : recorder.batch_sizes) {
    EXPECT_LE(size, 4u);
    images += size;
  }
  EXPECT_EQ(images, rendered.size());

  recorder.fail = true;
  std::atomic<int> failures{0};
  {
    std::vector<std::jthread> callers;
    for (int i = 0; i < 3; ++i) {
      callers.emplace_back([&] {
        try {
          service.render(a, as_bytes(jpeg));
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "the device fell over");
          ++failures;
        }
      });
    }
  }
  EXPECT_EQ(failures.load(), 3);
  EXPECT_EQ(service.stats().transform_errors, 3u);
}

// ---- a real mount ---------------------------------------------------------------------------

constexpr const char* kDataset = "pics";

struct SourceFile {
  std::string path;
  std::string content;
};

std::vector<SourceFile> source_files() {
  return {
      {"cats/a.jpg", make_jpeg(120, 90, 1)},
      {"cats/b.JPEG", make_jpeg(64, 128, 2)},
      {"cats/notes.txt", "not an image\n"},
      {"dogs/c.jpeg", make_jpeg(300, 40, 3)},
      {"dogs/broken.jpg", std::string("\xff\xd8\xff\xe0 truncated", 15)},
      {"dogs/deep/d.jpg", make_jpeg(50, 50, 4)},
      // A directory whose name is what an image's .npy would be called: it wins.
      {"dogs/e.jpg", make_jpeg(20, 20, 5)},
      {"dogs/e.jpg.npy/inside.jpg", make_jpeg(20, 20, 6)},
  };
}

class ViewMountTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = std::make_unique<test::TempDir>("dsfs-views-test");
    redis_ = std::make_unique<test::TestRedisServer>();
    publish();
    const stdfs::path mountpoint = work_->path() / "mnt";
    stdfs::create_directories(mountpoint);
    MountOptions options;
    options.session.mountpoint = mountpoint;
    options.session.threads = 4;
    options.filesystem.cache_bytes = 16 << 20;
    options.filesystem.timeout = 2s;
    options.filesystem.connections = 2;
    options.filesystem.view_backend = view::BackendKind::kCpu;
    options.filesystem.view_cache_bytes = 4 << 20;
    auto client = std::make_shared<store::Client>(std::vector{redis_->endpoint()},
                                                  client_options(options.filesystem));
    auto datasets = load_datasets(*client, catalog::KeySchema("dsfs"), {kDataset});
    mount_ = std::make_unique<Mount>(std::move(client), std::move(datasets), options);
  }

  static void TearDownTestSuite() {
    mount_.reset();
    redis_.reset();
    work_.reset();
  }

  static void publish() {
    const catalog::KeySchema keys("dsfs");
    store::Client client({redis_->endpoint()});
    const uint64_t generation = catalog::begin_generation(client, keys, kDataset);
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4 << 20);
    builder.set_classes({"cats", "dogs"});
    uint64_t id = 0;
    for (const SourceFile& file : source_files()) {
      ++id;
      builder.add_file(file.path, file.content.size(), 1'600'000'000'000'000'000, 0644, id,
                       file.path.starts_with("cats") ? 0 : 1,
                       XXH64(file.content.data(), file.content.size(), 0), "");
      client.command({"SET", keys.object(kDataset, generation, id), file.content})
          .expect_ok("SET object");
    }
    catalog::DatasetInfo info;
    info.name = kDataset;
    info.generation = generation;
    info.source = "fs_views_test";
    catalog::publish(client, keys, info, std::move(builder).build());
  }

  static std::string source(const std::string& path) {
    for (const SourceFile& file : source_files()) {
      if (file.path == path) return file.content;
    }
    throw std::invalid_argument(path);
  }

  static stdfs::path mnt() { return mount_->mountpoint(); }
  static stdfs::path views() { return mnt() / ".views"; }
  static nlohmann::json stats() {
    return nlohmann::json::parse(test::read_file(mnt() / ".dsfs/stats.json"));
  }

  static inline std::unique_ptr<test::TempDir> work_;
  static inline std::unique_ptr<test::TestRedisServer> redis_;
  static inline std::unique_ptr<Mount> mount_;
};

TEST_F(ViewMountTest, ViewsSitsAtTheRootAndListsThePresets) {
  EXPECT_EQ(list_dir(mnt()), (std::set<std::string>{".dsfs", ".meta", ".views", kDataset}));
  std::set<std::string> presets;
  for (const auto& [name, text] : view::view_presets()) presets.insert(name);
  EXPECT_EQ(list_dir(views()), presets);
  EXPECT_EQ(list_dir(views() / "imagenet-eval"), std::set<std::string>{kDataset});
  // Nothing was added inside the dataset's own tree.
  EXPECT_EQ(list_dir(mnt() / kDataset), (std::set<std::string>{"cats", "dogs"}));
}

TEST_F(ViewMountTest, MirrorsDirectoriesAndListsOnlyImagesAsNpy) {
  const stdfs::path root = views() / "imagenet-eval" / kDataset;
  EXPECT_EQ(list_dir(root), (std::set<std::string>{"cats", "dogs"}));
  EXPECT_EQ(list_dir(root / "cats"), (std::set<std::string>{"a.jpg.npy", "b.JPEG.npy"}));
  EXPECT_EQ(list_dir(root / "dogs"),
            (std::set<std::string>{"c.jpeg.npy", "broken.jpg.npy", "deep", "e.jpg.npy"}));
  EXPECT_TRUE(stdfs::is_directory(root / "dogs/e.jpg.npy"));
  EXPECT_EQ(list_dir(root / "dogs/e.jpg.npy"), std::set<std::string>{"inside.jpg.npy"});
  EXPECT_FALSE(stdfs::exists(root / "cats/notes.txt"));
  EXPECT_FALSE(stdfs::exists(root / "cats/notes.txt.npy"));
  EXPECT_FALSE(stdfs::exists(root / "cats/a.jpg"));
  struct stat st {};
  ASSERT_EQ(::stat((root / "dogs").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 4u);  // ".", its entry, deep/.. and e.jpg.npy/..
}

TEST_F(ViewMountTest, StatAnswersTheSizeBeforeAnyRendering) {
  const uint64_t rendered_before = stats()["views"]["rendered"];
  for (const auto& [name, text] : view::view_presets()) {
    const view::ViewSpec spec = view::parse_view_spec(text);
    struct stat st {};
    const stdfs::path file = views() / name / kDataset / "dogs/c.jpeg.npy";
    ASSERT_EQ(::stat(file.c_str(), &st), 0) << file;
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), view::npy_file_size(spec));
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0444u);
  }
  EXPECT_EQ(stats()["views"]["rendered"], rendered_before);
}

TEST_F(ViewMountTest, FilesHoldTheHeaderAndTheCpuBackendsTensor) {
  for (const auto& [dir, spec_text] : std::vector<std::pair<std::string, std::string>>{
           {"imagenet-eval", "imagenet-eval"},
           {"resize=40x30,dtype=uint8,layout=hwc", "resize=40x30,dtype=uint8,layout=hwc"},
           {"resize=64,crop=48,dtype=float16,norm=0.5:0.5:0.5:0.25:0.25:0.25",
            "resize=64,crop=48,dtype=float16,norm=0.5:0.5:0.5:0.25:0.25:0.25"}}) {
    const view::ViewSpec spec = view::parse_view_spec(spec_text);
    for (const std::string path : {"cats/a.jpg", "cats/b.JPEG", "dogs/deep/d.jpg"}) {
      std::string content;
      ASSERT_EQ(read_errno(views() / dir / kDataset / (path + ".npy"), &content), 0) << path;
      EXPECT_EQ(content, expected_npy(spec, source(path))) << dir << " " << path;
    }
  }
}

TEST_F(ViewMountTest, TwoSpellingsShareFilesButNotDirectories) {
  const stdfs::path preset = views() / "imagenet-eval" / kDataset;
  const stdfs::path spelled = views() / "resize=256,crop=224,norm=imagenet" / kDataset;
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat((preset / "cats/a.jpg.npy").c_str(), &a), 0);
  ASSERT_EQ(::stat((spelled / "cats/a.jpg.npy").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  ASSERT_EQ(::stat((preset / "cats").c_str(), &a), 0);
  ASSERT_EQ(::stat((spelled / "cats").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  std::string x, y;
  ASSERT_EQ(read_errno(preset / "cats/b.JPEG.npy", &x), 0);
  ASSERT_EQ(read_errno(spelled / "cats/b.JPEG.npy", &y), 0);
  EXPECT_EQ(x, y);
}

TEST_F(ViewMountTest, InvalidSpecsAndUnknownNamesAreNotFound) {
  for (const char* name : {"resize=256", "nonsense", "crop=224,dtype=float64"}) {
    struct stat st {};
    EXPECT_EQ(::stat((views() / name).c_str(), &st), -1) << name;
    EXPECT_EQ(errno, ENOENT) << name;
  }
  struct stat st {};
  EXPECT_EQ(::stat((views() / "imagenet-eval/nope").c_str(), &st), -1);
  EXPECT_EQ(::stat((views() / "imagenet-eval" / kDataset / "cats/zzz.jpg.npy").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(ViewMountTest, AnUndecodableImageIsEioAndCountedOnce) {
  const stdfs::path broken = views() / "imagenet-eval" / kDataset / "dogs/broken.jpg.npy";
  const uint64_t errors_before = stats()["views"]["render_errors"];
  EXPECT_EQ(read_errno(broken), EIO);
  EXPECT_EQ(read_errno(broken), EIO);
  const nlohmann::json now = stats();
  EXPECT_EQ(now["views"]["render_errors"], errors_before + 1);
  EXPECT_EQ(now["errors"]["view_render"], errors_before + 1);
  EXPECT_EQ(now["views"]["backend"], "cpu");
}

TEST_F(ViewMountTest, ViewFilesCarryTheImagesLabel) {
  char value[16] = {};
  const stdfs::path file = views() / "imagenet-eval" / kDataset / "dogs/c.jpeg.npy";
  const ssize_t n = ::getxattr(file.c_str(), "user.dsfs.label", value, sizeof value);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(value, static_cast<size_t>(n)), "1");
}

}  // namespace
}  // namespace dsfs::fs
