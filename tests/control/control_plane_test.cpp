// control_plane_test.cpp — the job's control plane: HMAC, the secret handshake, the store's operations, and the
// strangers it must drop without stalling the job's own connections (a wrong secret, one byte then silence, an
// oversized message, garbage), and the address it listens on.
#include "meshtrain/control/client.hpp"
#include "meshtrain/control/protocol.hpp"
#include "meshtrain/control/secret.hpp"
#include "meshtrain/control/server.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

namespace meshtrain::control {
namespace {

using namespace std::chrono_literals;

std::string hex(const Digest& digest) {
  std::ostringstream out;
  for (uint8_t b : digest) out << std::hex << (b >> 4) << (b & 15);
  return out.str();
}

ServerOptions server_options(const std::string& secret) {
  ServerOptions options;
  options.address = "127.0.0.1";
  options.port = 0;
  options.secret = secret;
  options.handshake_timeout_s = 1;
  options.message_timeout_s = 1;
  return options;
}

ClientOptions client_options(const ControlPlaneServer& server, const std::string& secret) {
  ClientOptions options;
  options.address = "127.0.0.1";
  options.port = server.port();
  options.secret = secret;
  options.connect_timeout_s = 5;
  options.reply_timeout_s = 5;
  return options;
}

// A raw TCP connection to 127.0.0.1:port (or another loopback address), as a stranger makes one.
int raw_connect(int port, const char* address = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, address, &to.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Waits up to 5 s for the server to have dropped `count` connections.
bool dropped_at_least(const ControlPlaneServer& server, int64_t count) {
  for (int i = 0; i < 250 && server.dropped_connections() < count; ++i) std::this_thread::sleep_for(20ms);
  return server.dropped_connections() >= count;
}

TEST(ControlPlaneSecretTest, HmacMatchesRfc4231) {
  // RFC 4231, test case 2.
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(make_secret().size(), 64u);
  EXPECT_NE(make_secret(), make_secret());
}

TEST(ControlPlaneSecretTest, SecretFileMustBePrivate) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "meshtrain_secret_test";
  std::ofstream(path) << "  s3cret \n";
  ::chmod(path.c_str(), 0644);
  try {
    read_secret_file(path.string());
    FAIL() << "a secret file readable by others was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  ::chmod(path.c_str(), 0600);
  EXPECT_EQ(read_secret_file(path.string()), "s3cret");
  std::filesystem::remove(path);
}

TEST(ControlPlaneSecretTest, JobsOffLoopbackNeedASecret) {
  const auto no_env = [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  try {
    resolve_job_secret(SecretSources{std::nullopt, no_env}, 2, false);
    FAIL() << "a two-host job off loopback started without a secret";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--secret-file"), std::string::npos) << e.what();
  }
  EXPECT_EQ(resolve_job_secret(SecretSources{std::nullopt, no_env}, 2, true).value, "");
  EXPECT_EQ(resolve_job_secret(SecretSources{std::nullopt, no_env}, 1, false).value.size(), 64u);
  const auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "MESHTRAIN_JOB_SECRET") return std::string("from-env");
    return std::nullopt;
  };
  EXPECT_EQ(resolve_job_secret(SecretSources{std::nullopt, env}, 2, false).value, "from-env");
}

TEST(ControlPlaneProtocolTest, RequestsRoundTripAndMalformedOnesAreRefused) {
  Request request = make_request(Op::kCompareSet, {"key"});
  request.value = "desired";
  request.expected = "expected";
  const std::string payload = encode(request);
  const Request back = decode_request(payload);
  EXPECT_EQ(back.op, Op::kCompareSet);
  EXPECT_EQ(back.keys, std::vector<std::string>{"key"});
  EXPECT_EQ(back.value, "desired");
  EXPECT_EQ(back.expected, "expected");
  for (size_t cut = 0; cut < payload.size(); ++cut)
    EXPECT_THROW(decode_request(payload.substr(0, cut)), ProtocolError) << "cut at " << cut;
  EXPECT_THROW(decode_request(payload + "x"), ProtocolError);
  EXPECT_THROW(decode_request(std::string(1, '\x63')), ProtocolError);
  std::string huge_count = encode(make_request(Op::kCheck));
  huge_count.replace(1, 4, std::string("\xff\xff\xff\x7f", 4));
  EXPECT_THROW(decode_request(huge_count), ProtocolError);
}

TEST(ControlPlaneTest, StoreOperations) {
  ControlPlaneServer server(server_options("secret"));
  ControlPlaneClient a(client_options(server, "secret"));
  ControlPlaneClient b(client_options(server, "secret"));
  a.set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.get("k", 1s), std::string("v\0w", 3));
  EXPECT_EQ(b.get("missing", 50ms), std::nullopt);
  EXPECT_EQ(a.add("n", 5), 5);
  EXPECT_EQ(b.add("n", -2), 3);
  EXPECT_EQ(a.compare_set("abort", "", "first"), "first");
  EXPECT_EQ(b.compare_set("abort", "", "second"), "first");
  EXPECT_EQ(b.compare_set("abort", "first", "third"), "third");
  EXPECT_EQ(a.compare_set("absent", "x", "y"), "x");
  EXPECT_TRUE(a.check({"k", "n"}));
  EXPECT_FALSE(a.check({"k", "absent"}));
  EXPECT_EQ(a.key_count(), 3);
  EXPECT_TRUE(a.remove("k"));
  EXPECT_FALSE(a.remove("k"));
  EXPECT_FALSE(a.wait({"late"}, 50ms));
  // A wait blocks only its own connection, and wakes when another sets the key.
  auto waiting = std::async(std::launch::async, [&] { return a.wait({"late", "n"}, 5s); });
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(b.add("other", 1), 1);
  b.set("late", "1");
  EXPECT_TRUE(waiting.get());
}

TEST(ControlPlaneTest, AWrongSecretIsRefusedAndReadsNothing) {
  ControlPlaneServer server(server_options("the job's secret"));
  ControlPlaneClient host(client_options(server, "the job's secret"));
  host.set("meshtrain/abort", "");
  host.remove("meshtrain/abort");
  try {
    ControlPlaneClient stranger(client_options(server, "a guess"));
    FAIL() << "a client without the secret was admitted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("refused"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(dropped_at_least(server, 1));
  EXPECT_FALSE(host.check({"meshtrain/abort"}));
  // A client that talks to an impostor (a server with another secret) finds out before sending anything.
  ControlPlaneServer impostor(server_options("another"));
  ClientOptions to_impostor = client_options(impostor, "the job's secret");
  EXPECT_THROW(ControlPlaneClient{to_impostor}, UserError);
}

TEST(ControlPlaneTest, StrangersAreDroppedWithoutStallingTheJob) {
  ControlPlaneServer server(server_options("s"));
  ControlPlaneClient host(client_options(server, "s"));
  // One byte, then silence: the handshake deadline drops it.
  const int one_byte = raw_connect(server.port());
  ASSERT_GE(one_byte, 0);
  ASSERT_EQ(::send(one_byte, "\0", 1, 0), 1);
  // A frame header announcing 4 GiB: refused at once.
  const int oversized = raw_connect(server.port());
  ASSERT_EQ(::send(oversized, "\xff\xff\xff\xff", 4, 0), 4);
  // A plain TCPStore-style request (garbage to this protocol).
  const int garbage = raw_connect(server.port());
  const std::string junk(64, '\x07');
  ASSERT_EQ(::send(garbage, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
  // Meanwhile the job's own connection is served at once.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) host.add("heartbeat", 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 500ms);
  EXPECT_TRUE(dropped_at_least(server, 3));
  ControlPlaneClient late(client_options(server, "s"));
  EXPECT_EQ(late.add("heartbeat", 0), 20);
  for (int fd : {one_byte, oversized, garbage}) ::close(fd);
}

TEST(ControlPlaneTest, ListensOnTheCoordinatorAddressOnly) {
  ControlPlaneServer server(server_options("s"));
  // Bound to 127.0.0.1, not to every address: 127.0.0.2 (also this machine) is refused.
  const int other = raw_connect(server.port(), "127.0.0.2");
  EXPECT_LT(other, 0) << "the control plane answered on 127.0.0.2: it listens on every address";
  if (other >= 0) ::close(other);
  // /proc/net/tcp lists the listening socket (state 0A) with local address 0100007F (127.0.0.1).
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", server.port());
  bool found = false;
  while (std::getline(tcp, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (state == "0A" && local.size() > 5 && local.substr(local.size() - 4) == port_hex) {
      EXPECT_EQ(local, std::string("0100007F:") + port_hex);
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(ControlPlaneTest, StoppingTheServerEndsWaitingClients) {
  auto server = std::make_unique<ControlPlaneServer>(server_options("s"));
  ControlPlaneClient host(client_options(*server, "s"));
  auto waiting = std::async(std::launch::async, [&] { return host.wait({"never"}, 0ms); });
  std::this_thread::sleep_for(50ms);
  server.reset();
  EXPECT_THROW(waiting.get(), ControlPlaneError);
}

}  // namespace
}  // namespace meshtrain::control
