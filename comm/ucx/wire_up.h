// What every rank of a UCX communicator publishes at Init, and what the
// records tell: the worker addresses to connect, that the options deciding
// the algorithms agree, and which ranks share a machine and its cores.
//
//   std::string mine = RendezvousRecord(options, cores, address);
//   ... every rank's record gathered through the store ...
//   absl::StatusOr<Peers> peers = ParseRecords(all);
#ifndef FUSEBOX_COMM_UCX_WIRE_UP_H_
#define FUSEBOX_COMM_UCX_WIRE_UP_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/options.h"

namespace fusebox::comm::ucx {

// [u32 length][the options that decide the algorithms][u32 length][this
// machine's boot id][u32 length][its cores, decimal][address]. Ranks whose
// options differ would pick different algorithms and hang, so a difference
// is an error naming both ranks. The boot id tells which ranks share a
// machine (and its cores), network namespaces included.
std::string RendezvousRecord(const UcxOptions& options, unsigned cores,
                             const std::string& address);

// Every rank's record, parsed.
struct Peers {
  std::vector<std::string> addresses;  // by rank
  std::vector<std::string> machines;   // boot ids; "" where unknown
  std::vector<unsigned> cores;         // each rank's machine's

  // Ranks on rank r's machine: those with its boot id, or all where it is
  // unknown. Every rank computes the same for every rank.
  unsigned RanksAt(int r) const;
  bool OversubscribedAt(int r) const { return RanksAt(r) > cores[r]; }
  bool AnyOversubscribed() const;
};

// DataLoss for a malformed record; InvalidArgument where a rank's options
// differ from rank 0's, naming both.
absl::StatusOr<Peers> ParseRecords(const std::vector<std::string>& all);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_WIRE_UP_H_
