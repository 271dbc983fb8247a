// EmbeddedServer with a temporary DSFS_HOME: start, status, stop, persistence, concurrency.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "src/store/connection.h"
#include "src/store/embedded_server.h"
#include "src/store/errors.h"
#include "tests/unit/support/files.h"

namespace dsfs::store {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// True while pid exists and has not exited (a zombie waiting for its reaper has exited).
bool is_running_process(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

class EmbeddedServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    try {
      EmbeddedServer(home_).stop();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stop in teardown failed: " << e.what();
    }
  }
  test::TempDir home_dir_{"dsfs-home"};  // removed after TearDown has stopped the server
  const fs::path home_ = home_dir_.path();
};

TEST_F(EmbeddedServerTest, NotRunningBeforeStart) {
  EmbeddedServer server(home_);
  const EmbeddedServerStatus status = server.status();
  EXPECT_FALSE(status.running);
  EXPECT_EQ(status.pid, 0);
  EXPECT_EQ(status.socket, home_ / "redis" / "redis.sock");
  EXPECT_EQ(status.data_dir, home_ / "redis" / "data");
  EXPECT_FALSE(server.stop());
}

TEST_F(EmbeddedServerTest, StartServesOnTheSocketAndStopEndsIt) {
  EmbeddedServer server(home_);
  EXPECT_TRUE(server.start());
  const EmbeddedServerStatus status = server.status();
  ASSERT_TRUE(status.running);
  EXPECT_GT(status.pid, 0);
  EXPECT_TRUE(fs::exists(status.socket));
  EXPECT_TRUE(fs::exists(home_ / "redis" / "redis.conf"));

  const RedisEndpoint endpoint = server.endpoint();
  EXPECT_EQ(endpoint.transport, RedisEndpoint::Transport::kUnix);
  EXPECT_EQ(endpoint.socket_path, status.socket.string());
  Connection conn(endpoint);
  EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
  // Unix socket only: no TCP listener.
  EXPECT_EQ(Reply::element_str(conn.command({"CONFIG", "GET", "port"}).element(1)), "0");

  EXPECT_FALSE(server.start()) << "a second start should find it running";
  EXPECT_EQ(server.status().pid, status.pid);

  EXPECT_TRUE(server.stop());
  EXPECT_FALSE(server.status().running);
  EXPECT_FALSE(is_running_process(status.pid)) << "redis-server still alive after stop";
  EXPECT_FALSE(server.stop());
}

TEST_F(EmbeddedServerTest, DataSurvivesStopAndStart) {
  EmbeddedServer server(home_);
  server.start();
  {
    Connection conn(server.endpoint());
    conn.command({"SET", "kept", std::string("bytes\0here", 10)}).expect_ok("SET");
    conn.command({"SADD", "dsfs:datasets", "a", "b"});
  }
  ASSERT_TRUE(server.stop());
  ASSERT_TRUE(server.start());
  Connection conn(server.endpoint());
  EXPECT_EQ(conn.command({"GET", "kept"}).str(), std::string("bytes\0here", 10));
  EXPECT_EQ(conn.command({"SCARD", "dsfs:datasets"}).integer(), 2);
}

TEST_F(EmbeddedServerTest, StalePidFileAndSocketAreDetected) {
  EmbeddedServer server(home_);
  fs::create_directories(home_ / "redis");
  // A pid that is certainly not a redis-server: this test process.
  std::ofstream(home_ / "redis" / "redis.pid") << ::getpid() << "\n";
  std::ofstream(home_ / "redis" / "redis.sock") << "not a socket";
  EXPECT_FALSE(server.status().running);
  EXPECT_TRUE(server.start());
  EXPECT_TRUE(server.status().running);
  EXPECT_NE(server.status().pid, ::getpid());
}

TEST_F(EmbeddedServerTest, RunningServerWithoutPidFileIsStillFound) {
  EmbeddedServer server(home_);
  server.start();
  const int pid = server.status().pid;
  fs::remove(home_ / "redis" / "redis.pid");
  const EmbeddedServerStatus status = server.status();
  EXPECT_TRUE(status.running);
  EXPECT_EQ(status.pid, pid);
  EXPECT_FALSE(server.start());
  EXPECT_TRUE(server.stop());
  EXPECT_FALSE(is_running_process(pid));
}

TEST_F(EmbeddedServerTest, KilledServerIsReportedStoppedAndRestarts) {
  EmbeddedServer server(home_);
  server.start();
  const int pid = server.status().pid;
  ASSERT_GT(pid, 0);
  ::kill(pid, SIGKILL);
  for (int i = 0; i < 200 && server.status().running; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(server.status().running);
  EXPECT_TRUE(server.start());
  EXPECT_EQ(Connection(server.endpoint()).command({"PING"}).str(), "PONG");
}

TEST_F(EmbeddedServerTest, ConcurrentStartsStartOneServer) {
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      if (EmbeddedServer(home_).start()) ++started;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(started.load(), 1);
  EXPECT_TRUE(EmbeddedServer(home_).status().running);
}

TEST_F(EmbeddedServerTest, HomeWithSpacesWorks) {
  const fs::path spaced = home_ / "my dsfs home";
  EmbeddedServer server(spaced);
  EXPECT_TRUE(server.start());
  EXPECT_EQ(Connection(server.endpoint()).command({"PING"}).str(), "PONG");
  EXPECT_TRUE(server.stop());
}

TEST_F(EmbeddedServerTest, SocketPathTooLongIsAClearError) {
  const fs::path deep = home_ / std::string(120, 'x');
  try {
    EmbeddedServer(deep).start();
    FAIL() << "a socket path over the unix limit should be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("DSFS_HOME"));
  }
}

TEST_F(EmbeddedServerTest, MissingRedisServerBinarySaysWhatToInstall) {
  const char* old_path = std::getenv("PATH");
  const std::string saved = old_path ? old_path : "";
  ::setenv("PATH", home_.c_str(), 1);  // a directory without redis-server
  try {
    EmbeddedServer(home_).start();
    ADD_FAILURE() << "start without a redis-server binary should fail";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("install Debian's redis-server package"));
  }
  ::setenv("PATH", saved.c_str(), 1);
  EXPECT_FALSE(EmbeddedServer(home_).status().running);
}

TEST_F(EmbeddedServerTest, ChosenBinaryMustBeExecutable) {
  ::setenv("DSFS_REDIS_SERVER", (home_ / "missing").c_str(), 1);
  try {
    EmbeddedServer(home_).start();
    ADD_FAILURE() << "a missing DSFS_REDIS_SERVER should fail";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("DSFS_REDIS_SERVER"));
  }
  ::unsetenv("DSFS_REDIS_SERVER");
}

TEST(EmbeddedServerHomeTest, DefaultHomeFollowsEnvironment) {
  const char* old_home = std::getenv("DSFS_HOME");
  const std::string saved = old_home ? old_home : "";
  ::setenv("DSFS_HOME", "/some/where", 1);
  EXPECT_EQ(EmbeddedServer::default_home(), fs::path("/some/where"));
  ::unsetenv("DSFS_HOME");
  const char* user_home = std::getenv("HOME");
  if (user_home && *user_home) {
    EXPECT_EQ(EmbeddedServer::default_home(), fs::path(user_home) / ".local/share/dsfs");
  }
  if (old_home) ::setenv("DSFS_HOME", saved.c_str(), 1);
}

}  // namespace
}  // namespace dsfs::store
