// Each kind of node on its own, without a mount: the answers the FUSE handlers turn into replies
// (the mount tests check the replies themselves).
#include <gtest/gtest.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <string>
#include <tuple>
#include <vector>

#include "fs/nodes/control_node.h"
#include "fs/nodes/dataset_node.h"
#include "fs/nodes/meta_node.h"
#include "fs/nodes/root_node.h"
#include "fs/nodes/view_node.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/connection.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::fs {
namespace {

constexpr int64_t kMtime = 1'600'000'000'000'000'000;
// The writing process the node tests stand for (writes need one; 0: not known).
constexpr WriteContext kWriter{};

struct SourceFile {
  std::string path;
  std::string content;
  uint32_t label;
  std::string metadata;
};

const std::vector<SourceFile>& source_files() {
  static const std::vector<SourceFile> files = {
      {"cats/a.jpg", "jpeg bytes of a", 0, R"({"path":"cats/a.jpg","box":[1,2]})"},
      {"cats/b.txt", "notes", 0, ""},
      {"dogs/c.JPEG", std::string(3000, 'c'), 1, ""},
      {"dogs/deep/d.png", "png bytes", 1, ""},
  };
  return files;
}

prefetch::DatasetSnapshot make_dataset(const std::string& name, uint64_t generation) {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4 << 20);
  builder.set_classes({"cats", "dogs"});
  uint64_t id = 0;
  for (const SourceFile& f : source_files()) {
    builder.add_file(f.path, f.content.size(), kMtime, 0644, ++id, f.label,
                     XXH64(f.content.data(), f.content.size(), 0), f.metadata);
  }
  prefetch::DatasetSnapshot d;
  d.info.name = name;
  d.info.generation = generation;
  d.info.created_unix = 1'700'000'000;
  d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
  return d;
}

std::vector<prefetch::DatasetSnapshot> two_datasets() {
  return {make_dataset("ds", 3), make_dataset("other", 1)};
}

// Collects a listing, optionally refusing entries after `room` (a full reply buffer).
struct Collected final : DirectorySink {
  size_t room = SIZE_MAX;
  std::vector<std::tuple<std::string, uint64_t, uint64_t, bool>> entries;
  bool add(std::string_view name, uint64_t ino, uint64_t position, bool cacheable) override {
    if (entries.size() == room) return false;
    entries.emplace_back(std::string(name), ino, position, cacheable);
    return true;
  }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& e : entries) out.push_back(std::get<0>(e));
    return out;
  }
};

std::string text_of(const ReadReply& reply) {
  std::string out;
  for (const iovec& piece : reply.pieces)
    out.append(static_cast<const char*>(piece.iov_base), piece.iov_len);
  return out;
}

// The read path of a mount, pointed at a Redis that may not exist (nothing connects until a
// read, and most tests here never read).
struct ReadPath {
  explicit ReadPath(store::RedisEndpoint endpoint)
      : client({std::move(endpoint)}, store::ClientOptions{.connections_per_node = 2}),
        cache(64 << 20),
        fetcher(client, catalog::KeySchema("dsfs"),
                prefetch::FetcherOptions{.timeout = std::chrono::milliseconds(2000)}),
        reader(cache, fetcher, /*verify=*/true) {}
  store::Client client;
  prefetch::ObjectCache cache;
  prefetch::ObjectFetcher fetcher;
  prefetch::FileReader reader;
};

store::RedisEndpoint unused_endpoint() {
  store::RedisEndpoint endpoint;
  endpoint.transport = store::RedisEndpoint::Transport::kUnix;
  endpoint.socket_path = "/nonexistent/dsfs-nodes-test.sock";
  return endpoint;
}

InodeRef ref_of(uint64_t ino) {
  return decode_inode(ino);
}

TEST(MountTree, NumbersDatasetsAndRefusesNamesItCannotShow) {
  const MountTree tree(two_datasets());
  EXPECT_EQ(tree.dataset(1)->index, 1u);
  EXPECT_EQ(tree.find("other"), 1u);
  EXPECT_FALSE(tree.find("missing"));
  EXPECT_EQ(tree.dataset(2), nullptr);
  for (const std::string name : {".meta", ".dsfs", ".views"}) {
    EXPECT_THROW(MountTree({make_dataset(name, 1)}), std::invalid_argument) << name;
  }
  EXPECT_THROW(MountTree({make_dataset("ds", 1), make_dataset("ds", 2)}), std::invalid_argument);
}

TEST(MountTree, EntryAttributesAreReadOnlyAndCountSubdirectories) {
  const MountTree tree(two_datasets());
  const prefetch::DatasetSnapshot& d = *tree.dataset(0);
  const uint32_t dogs = *d.catalog->find("dogs");
  const Attributes dir = tree.entry(d, dogs, 42);
  EXPECT_TRUE(S_ISDIR(dir.st.st_mode));
  EXPECT_EQ(dir.st.st_nlink, 3u);  // ".", its entry in the parent, and deep/
  EXPECT_EQ(dir.st.st_ino, 42u);
  const Attributes file = tree.entry(d, *d.catalog->find("dogs/c.JPEG"), 43);
  EXPECT_EQ(file.st.st_mode, S_IFREG | 0444);
  EXPECT_EQ(file.st.st_size, 3000);
  EXPECT_EQ(file.st.st_mtim.tv_sec, kMtime / 1'000'000'000);
  EXPECT_EQ(tree.entry(d, *d.catalog->find("dogs/c.JPEG"), 43, 128).st.st_size, 128);
}

TEST(RootNode, ListsItsOwnDirectoriesThenTheDatasetsAndResumes) {
  const MountTree tree(two_datasets());
  RootNode root(tree);
  Collected all;
  ASSERT_EQ(root.list(ref_of(kRootInode), 0, all), 0);
  EXPECT_EQ(all.names(), (std::vector<std::string>{".dsfs", ".meta", ".views", "ds", "other"}));
  EXPECT_EQ(std::get<1>(all.entries[4]), entry_inode(1, catalog::kRootIndex));
  // A full reply stops the listing; asked again from where it stopped, it goes on.
  Collected first;
  first.room = 2;
  ASSERT_EQ(root.list(ref_of(kRootInode), 0, first), 0);
  ASSERT_EQ(first.entries.size(), 2u);
  Collected rest;
  ASSERT_EQ(root.list(ref_of(kRootInode), 2, rest), 0);
  EXPECT_EQ(rest.names(), (std::vector<std::string>{".views", "ds", "other"}));
  EXPECT_EQ(std::get<2>(rest.entries[0]), 2u);

  EXPECT_EQ(root.lookup(ref_of(kRootInode), ".meta").ino, kMetaDirInode);
  EXPECT_EQ(root.lookup(ref_of(kRootInode), "other").ino, entry_inode(1, catalog::kRootIndex));
  EXPECT_EQ(root.lookup(ref_of(kRootInode), "nope").ino, 0u);
  EXPECT_EQ(root.stat(ref_of(kRootInode))->st.st_nlink, 2u + 3u + 2u);
  EXPECT_EQ(root.open(ref_of(kRootInode)), EISDIR);
}

TEST(DatasetNode, WalksTheCatalogue) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  FsCounters counters;
  DatasetNode node(tree, path.reader, counters);
  const prefetch::DatasetSnapshot& d = *tree.dataset(0);
  const InodeRef root = ref_of(entry_inode(0, catalog::kRootIndex));
  const uint64_t dogs = node.lookup(root, "dogs").ino;
  ASSERT_NE(dogs, 0u);
  EXPECT_TRUE(node.is_directory(ref_of(dogs)));
  EXPECT_EQ(node.parent(ref_of(dogs)), entry_inode(0, catalog::kRootIndex));
  EXPECT_EQ(node.parent(root), kRootInode);
  Collected children;
  ASSERT_EQ(node.list(ref_of(dogs), 0, children), 0);
  EXPECT_EQ(children.names(), (std::vector<std::string>{"c.JPEG", "deep"}));
  const uint64_t deep = node.lookup(ref_of(dogs), "deep").ino;
  EXPECT_EQ(node.parent(ref_of(deep)), dogs);

  const uint64_t c = node.lookup(ref_of(dogs), "c.JPEG").ino;
  EXPECT_EQ(c, entry_inode(0, *d.catalog->find("dogs/c.JPEG")));
  EXPECT_EQ(node.stat(ref_of(c))->st.st_size, 3000);
  EXPECT_EQ(node.open(ref_of(c)), 0);
  EXPECT_EQ(node.open(ref_of(dogs)), EISDIR);
  Collected none;
  EXPECT_EQ(node.list(ref_of(c), 0, none), ENOTDIR);
  EXPECT_EQ(node.lookup(ref_of(c), "x").ino, 0u);
  // An entry or a dataset this mount does not have names nothing.
  const InodeRef past_end = ref_of(entry_inode(0, d.catalog->entry_count()));
  EXPECT_FALSE(node.stat(past_end));
  EXPECT_EQ(node.open(past_end), ENOENT);
  EXPECT_FALSE(node.stat(ref_of(entry_inode(7, 0))));
  EXPECT_EQ(node.list(past_end, 0, none), ENOENT);
}

TEST(DatasetNode, AnswersUserXattrsFromTheCatalogue) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  FsCounters counters;
  DatasetNode node(tree, path.reader, counters);
  const catalog::Catalog& catalog = *tree.dataset(0)->catalog;
  const InodeRef a = ref_of(entry_inode(0, *catalog.find("cats/a.jpg")));
  const InodeRef c = ref_of(entry_inode(0, *catalog.find("dogs/c.JPEG")));
  std::string value;
  ASSERT_EQ(node.xattr(c, "user.dsfs.label", value), 0);
  EXPECT_EQ(value, "1");
  ASSERT_EQ(node.xattr(c, "user.dsfs.class", value), 0);
  EXPECT_EQ(value, "dogs");
  EXPECT_EQ(node.xattr(c, "user.dsfs.meta", value), ENODATA);
  ASSERT_EQ(node.xattr(a, "user.dsfs.meta", value), 0);
  EXPECT_EQ(value, source_files()[0].metadata);
  std::string names;
  ASSERT_EQ(node.xattr_names(a, names), 0);
  EXPECT_EQ(names, std::string("user.dsfs.label\0user.dsfs.class\0user.dsfs.meta\0", 47));
  ASSERT_EQ(node.xattr_names(c, names), 0);
  EXPECT_EQ(names, std::string("user.dsfs.label\0user.dsfs.class\0", 32));
  EXPECT_EQ(node.xattr(ref_of(entry_inode(0, *catalog.find("cats"))), "user.dsfs.label", value),
            ENODATA);
  EXPECT_EQ(node.xattr(ref_of(entry_inode(5, 1)), "user.dsfs.label", value), ENOENT);
}

TEST(DatasetNode, ReadsFilesThroughTheReadPathAndCountsThem) {
  test::TestRedisServer redis;
  const MountTree tree(two_datasets());
  const prefetch::DatasetSnapshot& d = *tree.dataset(0);
  {
    store::Connection conn(redis.endpoint());
    const catalog::KeySchema keys("dsfs");
    uint64_t id = 0;
    for (const SourceFile& f : source_files()) {
      conn.command({"SET", keys.object(d.name(), d.generation(), ++id), f.content})
          .expect_ok("SET object");
    }
  }
  ReadPath path(redis.endpoint());
  FsCounters counters;
  DatasetNode node(tree, path.reader, counters);
  const InodeRef c = ref_of(entry_inode(0, *d.catalog->find("dogs/c.JPEG")));
  ReadReply whole;
  ASSERT_EQ(node.read(c, 0, 1 << 20, whole), 0);
  EXPECT_EQ(text_of(whole), source_files()[2].content);
  EXPECT_FALSE(whole.owners.empty());  // the cached buffer stays alive until the reply is sent
  ReadReply tail;
  ASSERT_EQ(node.read(c, 2990, 100, tail), 0);
  EXPECT_EQ(text_of(tail), std::string(10, 'c'));
  EXPECT_EQ(counters.files_read.load(), 1u);  // only a READ at offset 0 starts a file
  EXPECT_EQ(counters.bytes_read.load(), 3010u);
  ReadReply none;
  EXPECT_EQ(node.read(ref_of(entry_inode(0, *d.catalog->find("dogs"))), 0, 10, none), EISDIR);
}

TEST(MetaNode, RendersEachFileOnceWithItsExactSize) {
  const MountTree tree(two_datasets());
  MetaNode node(tree, "dsfs");
  Collected datasets;
  ASSERT_EQ(node.list(ref_of(kMetaDirInode), 0, datasets), 0);
  EXPECT_EQ(datasets.names(), (std::vector<std::string>{"ds", "other"}));
  const uint64_t dir = node.lookup(ref_of(kMetaDirInode), "other").ino;
  ASSERT_EQ(dir, meta_inode(1, MetaFile::kDirectory));
  EXPECT_EQ(node.parent(ref_of(dir)), kMetaDirInode);
  Collected files;
  ASSERT_EQ(node.list(ref_of(dir), 0, files), 0);
  EXPECT_EQ(files.names(),
            (std::vector<std::string>{"info.json", "classes.txt", "labels.csv", "metadata.jsonl"}));
  const uint64_t classes = node.lookup(ref_of(dir), "classes.txt").ino;
  ASSERT_NE(classes, 0u);
  EXPECT_EQ(node.lookup(ref_of(dir), "nope.txt").ino, 0u);
  EXPECT_EQ(node.stat(ref_of(classes))->st.st_size, 10);
  EXPECT_EQ(node.stat(ref_of(classes))->st.st_mtim.tv_sec, 1'700'000'000);
  ReadReply reply;
  ASSERT_EQ(node.read(ref_of(classes), 5, 100, reply), 0);
  EXPECT_EQ(text_of(reply), "dogs\n");
  EXPECT_EQ(&node.content(1, MetaFile::kClasses), &node.content(1, MetaFile::kClasses));
  EXPECT_EQ(node.open(ref_of(dir)), EISDIR);
  EXPECT_EQ(node.open(ref_of(meta_inode(9, MetaFile::kInfo))), ENOENT);
  EXPECT_FALSE(node.stat(ref_of(meta_inode(9, MetaFile::kInfo))));
}

TEST(ViewNode, ShowsOnlyImagesAsNpyFilesUnderAnySpec) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  ViewFiles views(path.reader, path.cache, 256 << 20);
  ViewNode node(tree, views);
  Collected presets;
  ASSERT_EQ(node.list(ref_of(kViewsDirInode), 0, presets), 0);
  ASSERT_FALSE(presets.entries.empty());
  const uint64_t spec = node.lookup(ref_of(kViewsDirInode), "resize=32x24,dtype=uint8").ino;
  ASSERT_NE(spec, 0u);
  EXPECT_EQ(node.lookup(ref_of(kViewsDirInode), "resize=banana").ino, 0u);
  EXPECT_EQ(node.parent(ref_of(spec)), kViewsDirInode);
  Collected datasets;
  ASSERT_EQ(node.list(ref_of(spec), 0, datasets), 0);
  EXPECT_EQ(datasets.names(), (std::vector<std::string>{"ds", "other"}));
  const uint64_t ds = node.lookup(ref_of(spec), "ds").ino;
  EXPECT_EQ(node.parent(ref_of(ds)), spec);
  const uint64_t cats = node.lookup(ref_of(ds), "cats").ino;
  Collected images;
  ASSERT_EQ(node.list(ref_of(cats), 0, images), 0);
  EXPECT_EQ(images.names(), std::vector<std::string>{"a.jpg.npy"});  // b.txt is no image
  EXPECT_EQ(node.lookup(ref_of(cats), "b.txt.npy").ino, 0u);
  const uint64_t a = node.lookup(ref_of(cats), "a.jpg.npy").ino;
  ASSERT_EQ(a, std::get<1>(images.entries[0]));
  const Attributes attributes = *node.stat(ref_of(a));
  EXPECT_TRUE(S_ISREG(attributes.st.st_mode));
  EXPECT_EQ(static_cast<uint64_t>(attributes.st.st_size),
            views.registry().slot(decode_inode(spec).view_slot)->file_size);
  EXPECT_EQ(node.open(ref_of(a)), 0);
  EXPECT_EQ(node.open(ref_of(cats)), EISDIR);
  std::string value;
  ASSERT_EQ(node.xattr(ref_of(a), "user.dsfs.class", value), 0);
  EXPECT_EQ(value, "cats");
  EXPECT_EQ(node.xattr(ref_of(spec), "user.dsfs.class", value), ENODATA);
}

// An image x.jpg beside a directory named x.jpg.npy: the directory takes the name in the view,
// and the image's view is not shown, which a loader walking the view never learnt (found by an
// audit). It is warned about, once per dataset generation.
TEST(ViewNode, AnImageWhoseViewNameADirectoryTakesIsNamedInTheLog) {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4 << 20);
  builder.add_file("c/img.jpg", 5, kMtime, 0644, 1, catalog::kNoLabel, 0, "");
  builder.add_file("c/img.jpg.npy/inner.jpg", 5, kMtime, 0644, 2, catalog::kNoLabel, 0, "");
  builder.add_file("c/z.png", 5, kMtime, 0644, 3, catalog::kNoLabel, 0, "");
  std::vector<prefetch::DatasetSnapshot> datasets(1);
  datasets[0].info.name = "coll";
  datasets[0].info.generation = 7;
  datasets[0].catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
  const MountTree tree(std::move(datasets));
  ReadPath path(unused_endpoint());
  ViewFiles views(path.reader, path.cache, 256 << 20);
  ViewNode node(tree, views);
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(100);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", ring));
  const uint64_t spec = node.lookup(ref_of(kViewsDirInode), "imagenet-eval").ino;
  const uint64_t dir = node.lookup(ref_of(node.lookup(ref_of(spec), "coll").ino), "c").ino;
  for (int pass = 0; pass < 3; ++pass) {
    Collected listed;
    ASSERT_EQ(node.list(ref_of(dir), 0, listed), 0);
    EXPECT_EQ(listed.names(), (std::vector<std::string>{"img.jpg.npy", "z.png.npy"}));
  }
  spdlog::set_default_logger(previous);
  const std::vector<std::string> lines = ring->last_formatted();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("coll/c/img.jpg: its view img.jpg.npy is not shown"), std::string::npos)
      << lines[0];
}

TEST(ControlNode, EveryStatsLookupIsANewSnapshotFreedByForget) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  prefetch::PrefetchEngine engine(path.cache, path.fetcher, tree.table(), path.client, false,
                                  prefetch::EngineOptions{});
  int renders = 0;
  ControlNode node(
      tree, [&] { return "{\"render\":" + std::to_string(++renders) + "}"; }, engine);
  const InodeRef dir = ref_of(kControlDirInode);
  const Found first = node.lookup(dir, "stats.json");
  const Found second = node.lookup(dir, "stats.json");
  EXPECT_FALSE(first.cacheable);
  EXPECT_NE(first.ino, second.ino);
  EXPECT_EQ(node.snapshot_count(), 2u);
  ReadReply reply;
  ASSERT_EQ(node.read(ref_of(first.ino), 0, 4096, reply), 0);
  EXPECT_EQ(text_of(reply), "{\"render\":1}");
  EXPECT_EQ(node.stat(ref_of(second.ino))->st.st_size, 12);
  // Two lookups of one inode need two forgets; the reply in flight keeps its bytes.
  node.forget(first.ino, 1);
  EXPECT_FALSE(node.stat(ref_of(first.ino)));
  EXPECT_EQ(text_of(reply), "{\"render\":1}");
  ReadReply gone;
  EXPECT_EQ(node.read(ref_of(first.ino), 0, 10, gone), ESTALE);
  EXPECT_EQ(node.open(ref_of(first.ino)), ENOENT);
  node.forget(second.ino, 5);
  EXPECT_EQ(node.snapshot_count(), 0u);

  Collected listed;
  ASSERT_EQ(node.list(dir, 0, listed), 0);
  EXPECT_EQ(listed.names(), (std::vector<std::string>{"stats.json", "plan", "refresh"}));
  EXPECT_FALSE(std::get<3>(listed.entries[0]));  // stats.json: never cached by name
  Collected from_one;
  ASSERT_EQ(node.list(dir, 1, from_one), 0);
  EXPECT_EQ(from_one.names(), (std::vector<std::string>{"plan", "refresh"}));
}

TEST(ControlNode, ThePlanIsTheOneWritableFile) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  prefetch::PrefetchEngine engine(path.cache, path.fetcher, tree.table(), path.client, false,
                                  prefetch::EngineOptions{});
  ControlNode node(
      tree, [] { return std::string("{}"); }, engine);
  const InodeRef plan = ref_of(node.lookup(ref_of(kControlDirInode), "plan").ino);
  ASSERT_EQ(plan.kind, InodeRef::Kind::kPlan);
  const std::string text = "ds/cats/a.jpg\nds/dogs/c.JPEG\n";
  ASSERT_EQ(node.write(plan, 0, text, kWriter), 0);
  EXPECT_EQ(node.stat(plan)->st.st_size, static_cast<off_t>(text.size()));
  EXPECT_EQ(node.stat(plan)->timeout, 0);
  EXPECT_EQ(node.write(plan, 3, "x\n", kWriter), EINVAL);  // neither a rewrite nor an append
  ASSERT_EQ(node.truncate(plan, 0, kWriter), 0);
  EXPECT_EQ(node.stat(plan)->st.st_size, 0);
  ReadReply reply;
  ASSERT_EQ(node.read(plan, 0, 100, reply), 0);
  EXPECT_EQ(reply.size(), 0u);  // write-only
  const Found stats = node.lookup(ref_of(kControlDirInode), "stats.json");
  EXPECT_EQ(node.write(ref_of(stats.ino), 0, "x", kWriter), EROFS);
  EXPECT_EQ(node.truncate(ref_of(stats.ino), 0, kWriter), EROFS);
}

TEST(ControlNode, EachWriteToRefreshIsOneRequestOfDatasetNames) {
  const MountTree tree(two_datasets());
  ReadPath path(unused_endpoint());
  prefetch::PrefetchEngine engine(path.cache, path.fetcher, tree.table(), path.client, false,
                                  prefetch::EngineOptions{});
  std::vector<std::vector<std::string>> requests;
  int answer = 0;
  ControlNode node(
      tree, [] { return std::string("{}"); }, engine,
      [&](const std::vector<std::string>& names) {
        requests.push_back(names);
        return answer;
      });
  const InodeRef refresh = ref_of(node.lookup(ref_of(kControlDirInode), "refresh").ino);
  ASSERT_EQ(refresh.kind, InodeRef::Kind::kRefresh);
  EXPECT_EQ(node.stat(refresh)->st.st_mode, S_IFREG | 0200);
  EXPECT_EQ(node.open(refresh), 0);
  ASSERT_EQ(node.write(refresh, 0, "ds other\n", kWriter), 0);
  ASSERT_EQ(node.write(refresh, 0, "\n", kWriter), 0);  // every dataset
  ASSERT_EQ(node.truncate(refresh, 0, kWriter), 0);     // O_TRUNC
  answer = ENOENT;
  EXPECT_EQ(node.write(refresh, 9, "\tnew\r\n", kWriter), ENOENT);  // the refresh's answer
  EXPECT_EQ(requests, (std::vector<std::vector<std::string>>{{"ds", "other"}, {}, {"new"}}));
  // A name that cannot be a dataset's is refused before any refresh.
  EXPECT_EQ(node.write(refresh, 0, "ds bad/name", kWriter), EINVAL);
  EXPECT_EQ(requests.size(), 3u);

  // Without a refresh function (no watcher) the file refuses writes.
  ControlNode bare(
      tree, [] { return std::string("{}"); }, engine);
  EXPECT_EQ(bare.write(refresh, 0, "ds\n", kWriter), EROFS);
}

TEST(MountTree, ListingAReingestedNameKeepsTheOldSnapshotReadableByIndex) {
  MountTree tree(two_datasets());
  const std::shared_ptr<const MountTree::Listing> before = tree.listing();
  const prefetch::DatasetSnapshot& replaced = tree.list(make_dataset("ds", 4));
  EXPECT_EQ(replaced.index, 2u);
  EXPECT_EQ(tree.find("ds"), 2u);
  // The old generation stays where it was: inodes that carry index 0 keep their meaning.
  ASSERT_NE(tree.dataset(0), nullptr);
  EXPECT_EQ(tree.dataset(0)->generation(), 3u);
  EXPECT_EQ(tree.dataset(2)->generation(), 4u);
  // Same place in the listing; a listing taken before is unchanged.
  const std::shared_ptr<const MountTree::Listing> after = tree.listing();
  ASSERT_EQ(after->datasets.size(), 2u);
  EXPECT_EQ(after->datasets[0]->index, 2u);
  EXPECT_EQ(before->datasets[0]->index, 0u);

  const prefetch::DatasetSnapshot& added = tree.list(make_dataset("new", 1));
  EXPECT_EQ(added.index, 3u);
  EXPECT_EQ(tree.listing()->datasets.size(), 3u);
  EXPECT_EQ(tree.unlist("other"), 1u);
  EXPECT_FALSE(tree.find("other"));
  EXPECT_NE(tree.dataset(1), nullptr);  // unlisted, still readable by index
  EXPECT_EQ(tree.unlist("other"), std::nullopt);
  EXPECT_THROW(tree.list(make_dataset(".meta", 1)), std::invalid_argument);
  prefetch::DatasetSnapshot no_catalog = make_dataset("x", 1);
  no_catalog.catalog.reset();
  EXPECT_THROW(tree.list(std::move(no_catalog)), std::invalid_argument);
  EXPECT_EQ(tree.table().size(), 4u);  // nothing was stored by the refused ones
}

TEST(RootNode, ListsWhatTheTreeListsNowUnderEachSnapshotsOwnInode) {
  MountTree tree(two_datasets());
  RootNode node(tree);
  tree.list(make_dataset("ds", 9));  // index 2
  tree.unlist("other");
  tree.list(make_dataset("late", 1));  // index 3
  Collected listed;
  ASSERT_EQ(node.list(ref_of(kRootInode), 0, listed), 0);
  EXPECT_EQ(listed.names(), (std::vector<std::string>{".dsfs", ".meta", ".views", "ds", "late"}));
  EXPECT_EQ(std::get<1>(listed.entries[3]), entry_inode(2, catalog::kRootIndex));
  EXPECT_EQ(std::get<1>(listed.entries[4]), entry_inode(3, catalog::kRootIndex));
  EXPECT_EQ(node.lookup(ref_of(kRootInode), "ds").ino, entry_inode(2, catalog::kRootIndex));
  EXPECT_EQ(node.lookup(ref_of(kRootInode), "other").ino, 0u);
  EXPECT_EQ(node.stat(ref_of(kRootInode))->st.st_nlink, 2u + 3u + 2u);
  // A file of the replaced generation, or of the unlisted dataset, still answers by its inode.
  ReadPath path(unused_endpoint());
  FsCounters counters;
  DatasetNode files(tree, path.reader, counters);
  const uint32_t c = *tree.dataset(0)->catalog->find("dogs/c.JPEG");
  EXPECT_EQ(files.stat(ref_of(entry_inode(0, c)))->st.st_size, 3000);
  EXPECT_EQ(files.stat(ref_of(entry_inode(1, c)))->st.st_size, 3000);
  EXPECT_FALSE(files.stat(ref_of(entry_inode(4, c))));  // no such index yet
}

}  // namespace
}  // namespace dsfs::fs
