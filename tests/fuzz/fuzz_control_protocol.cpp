// fuzz_control_protocol.cpp — fuzzes the control plane's message decoding (control/protocol.hpp): the input as a
// request (decoded, encoded again and decoded again: the two must agree) and as a reply (every field read until the
// reply ends).
//
// Accepted: meshtrain::control::ProtocolError, the server's reason to drop a connection. Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/control/protocol.hpp"

using namespace meshtrain::control;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    const Request request = decode_request(input);
    const Request again = decode_request(encode(request));
    if (again.op != request.op || again.keys != request.keys || again.value != request.value ||
        again.expected != request.expected || again.number != request.number ||
        again.timeout_ms != request.timeout_ms)
      throw std::logic_error("a decoded request does not survive encode + decode");
  } catch (const ProtocolError&) {
  }
  try {
    ReplyReader reply(input);
    for (int field = 0; field < 4; ++field) {
      if (input.size() % 2 == 0)
        reply.bytes();
      else
        reply.number();
    }
    reply.finish();
  } catch (const ProtocolError&) {
  }
  return 0;
}
