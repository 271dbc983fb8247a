// MOUNT/.dsfs/plan: any bytes, in writes split where the input says (as FUSE delivers them),
// resolved against a small catalogue. Never a crash, and the plan's size is what was written.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "fs/node.h"
#include "fs/nodes/plan_file.h"
#include "prefetch/engine.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/pool.h"

namespace {

using namespace dsfs;

struct Fixture {
  Fixture() {
    spdlog::set_level(spdlog::level::off);
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1 << 20);
    builder.add_file("a/f0.bin", 100, 0, 0644, 1, catalog::kNoLabel, 0, "");
    builder.add_file("a/b/f1.bin", 100, 0, 0644, 2, catalog::kNoLabel, 0, "");
    builder.add_file("f2.bin", 100, 0, 0644, 3, catalog::kNoLabel, 0, "");
    prefetch::DatasetSnapshot d;
    d.info.name = "ds";
    d.info.generation = 1;
    d.info.chunk_size = 1 << 20;
    d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
    datasets.push_back(std::move(d));
    tree = std::make_unique<fs::MountTree>(std::move(datasets));
    // Never started and never connected: the plan file only parses and resolves.
    engine = std::make_unique<prefetch::PrefetchEngine>(
        cache, fetcher, tree->table(), client, false,
        prefetch::EngineOptions{.mode = prefetch::PrefetchMode::kPlan, .connections = 1});
    plan = std::make_unique<fs::PlanFile>(*tree, *engine);
  }
  store::RedisEndpoint endpoint = store::parse_redis_url("unix:///nonexistent/dsfs-fuzz.sock");
  std::vector<prefetch::DatasetSnapshot> datasets;
  store::Client client{{endpoint}, store::ClientOptions{.connections_per_node = 1}};
  prefetch::ObjectFetcher fetcher{client, catalog::KeySchema("dsfs"), prefetch::FetcherOptions{}};
  prefetch::ObjectCache cache{1 << 20};
  std::unique_ptr<fs::MountTree> tree;
  std::unique_ptr<prefetch::PrefetchEngine> engine;
  std::unique_ptr<fs::PlanFile> plan;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture fixture;
  auto& plan = *fixture.plan;
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 64;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  // One writer (the plan file keeps a stream per writing process; this process is alive, so
  // its stream is never taken for a gone writer's).
  const fs::WriteContext writer{.writer = static_cast<uint64_t>(::getpid())};
  if (plan.truncate(writer.writer, 0) != 0) __builtin_trap();
  while (!rest.empty()) {
    const std::string_view write = rest.substr(0, piece);
    if (plan.write(writer, plan.size(), write) != 0) __builtin_trap();
    rest.remove_prefix(write.size());
  }
  if (plan.size() != size - 1) __builtin_trap();
  (void)fixture.engine->stats();
  return 0;
}
