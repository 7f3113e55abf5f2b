// The UCX backend's rendezvous records. See wire_up.h.
#include "comm/ucx/wire_up.h"

#include <cstdint>
#include <cstring>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace fusebox::comm::ucx {
namespace {

// This machine's boot id (one per running kernel, shared by network
// namespaces), or "" where it cannot be read.
std::string MachineId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!std::getline(in, id) || id.size() > 64) return "";
  return id;
}

// Splits a [u32 length][bytes] field off the front of `rest`.
bool TakeField(absl::string_view* rest, std::string* field) {
  uint32_t len = 0;
  if (rest->size() < sizeof(len)) return false;
  std::memcpy(&len, rest->data(), sizeof(len));
  if (len > rest->size() - sizeof(len)) return false;
  *field = std::string(rest->substr(sizeof(len), len));
  rest->remove_prefix(sizeof(len) + len);
  return true;
}

}  // namespace

std::string RendezvousRecord(const UcxOptions& options, unsigned cores,
                             const std::string& address) {
  const std::string settings_text = absl::StrCat(
      "small_message_bytes=", options.small_message_bytes,
      " recursive_doubling_bytes=", options.recursive_doubling_bytes,
      " rabenseifner_bytes=", options.rabenseifner_bytes,
      " rabenseifner_from_bytes=", options.rabenseifner_from_bytes,
      " chunk_bytes=", options.chunk_bytes, " use_shared_memory=", options.use_shared_memory,
      " shm_chunk_bytes=", options.shm_chunk_bytes,
      " shm_stores=", static_cast<int>(options.shm_stores),
      " cma_min_bytes=", options.cma_min_bytes, " cma_max_bytes=", options.cma_max_bytes,
      " transports=", options.transports,
      " detect_peer_failure=", options.detect_peer_failure,
      " opening=", static_cast<int>(options.opening), " linear_bytes=", options.linear_bytes,
      " measured_choice_bytes=", options.measured_choice_bytes);
  std::string mine;
  for (const std::string& field : {settings_text, MachineId(), absl::StrCat(cores)}) {
    const uint32_t len = static_cast<uint32_t>(field.size());
    mine.append(reinterpret_cast<const char*>(&len), sizeof(len));
    mine += field;
  }
  mine += address;
  return mine;
}

absl::StatusOr<Peers> ParseRecords(const std::vector<std::string>& all) {
  const int size = static_cast<int>(all.size());
  Peers peers;
  std::vector<std::string> configs(size);
  peers.machines.resize(size);
  peers.addresses.resize(size);
  peers.cores.resize(size);
  for (int r = 0; r < size; ++r) {
    absl::string_view rest = all[r];
    std::string cores_text;
    if (!TakeField(&rest, &configs[r]) || !TakeField(&rest, &peers.machines[r]) ||
        !TakeField(&rest, &cores_text) || !absl::SimpleAtoi(cores_text, &peers.cores[r]) ||
        peers.cores[r] == 0) {
      return absl::DataLossError(absl::StrCat(
          "rank ", r, " published a malformed UCX rendezvous record (", all[r].size(), " bytes)"));
    }
    peers.addresses[r] = std::string(rest);
  }
  for (int r = 1; r < size; ++r) {
    if (configs[r] != configs[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "UCX options differ across ranks: rank 0 has {", configs[0], "} but rank ", r,
          " has {", configs[r], "}"));
    }
  }
  return peers;
}

unsigned Peers::RanksAt(int r) const {
  if (machines[r].empty()) return static_cast<unsigned>(machines.size());
  unsigned n = 0;
  for (const std::string& m : machines) n += m == machines[r] ? 1 : 0;
  return n;
}

bool Peers::AnyOversubscribed() const {
  for (int r = 0; r < static_cast<int>(machines.size()); ++r) {
    if (OversubscribedAt(r)) return true;
  }
  return false;
}

}  // namespace fusebox::comm::ucx
