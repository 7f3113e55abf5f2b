// Rendezvous under mpirun. See comm/mpi/rendezvous.h.
//
// Every MPI call here is collective over a private duplicate of
// MPI_COMM_WORLD (so that it cannot match the application's own traffic),
// and every rank takes the same branches: a failure on one rank (the server
// does not start, a client cannot connect) is shared with all ranks through
// MPI before anyone returns, so no rank is left waiting in a collective.
#include "comm/mpi/rendezvous.h"

// Only the C API: OpenMPI's deprecated C++ bindings need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/mpi/communicator.h"

namespace fusebox::comm {
namespace {

// Owns a communicator created here; frees it on every return path.
class ScopedComm {
 public:
  ScopedComm() = default;
  ~ScopedComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }
  ScopedComm(const ScopedComm&) = delete;
  ScopedComm& operator=(const ScopedComm&) = delete;
  MPI_Comm get() const { return comm_; }
  MPI_Comm* out() { return &comm_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
};

absl::Status MpiFailure(absl::string_view what, int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, buf, &len);
  return absl::InternalError(
      absl::StrCat("MPI rendezvous: ", what, " failed: ", absl::string_view(buf, len)));
}

// True when every rank runs on the processor named like ours.
absl::StatusOr<bool> AllOnOneHost(MPI_Comm comm, int size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(size) * MPI_MAX_PROCESSOR_NAME);
  const int rc = MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                               MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm);
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Allgather of processor names", rc);
  for (int r = 1; r < size; ++r) {
    if (std::memcmp(all.data(), all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME,
                    MPI_MAX_PROCESSOR_NAME) != 0) {
      return false;
    }
  }
  return true;
}

// Rank 0's text ("host:port", or an error message) on every rank; `ok` says
// which. Rank 0 passes its own values; the others' are overwritten.
absl::Status BroadcastText(MPI_Comm comm, int rank, bool& ok, std::string& text) {
  int header[2] = {ok ? 1 : 0, static_cast<int>(text.size())};
  int rc = MPI_Bcast(header, 2, MPI_INT, 0, comm);
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Bcast", rc);
  if (header[1] < 0 || header[1] > 65536) {
    return absl::InternalError("MPI rendezvous: bad address length from rank 0");
  }
  ok = header[0] != 0;
  if (rank != 0) text.assign(static_cast<size_t>(header[1]), '\0');
  rc = MPI_Bcast(text.data(), header[1], MPI_CHAR, 0, comm);
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Bcast", rc);
  return absl::OkStatus();
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "127.0.0.1";
  return buf;
}

}  // namespace

absl::StatusOr<Rendezvous> ConnectMpiRendezvous(absl::Duration timeout) {
  if (!MpiIsInitialized()) {
    return absl::FailedPreconditionError(
        "ConnectMpiRendezvous needs MPI to be initialised (call InitMpi first)");
  }
  ScopedComm world;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, world.out());
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(world.get(), MPI_ERRORS_RETURN);

  Rendezvous out;
  MPI_Comm_rank(world.get(), &out.rank);
  MPI_Comm_size(world.get(), &out.size);

  // Local rank: this rank's index among the ranks sharing its node.
  ScopedComm node;
  rc = MPI_Comm_split_type(world.get(), MPI_COMM_TYPE_SHARED, out.rank,
                           MPI_INFO_NULL, node.out());
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Comm_split_type", rc);
  MPI_Comm_rank(node.get(), &out.local_rank);

  absl::StatusOr<bool> one_host = AllOnOneHost(world.get(), out.size);
  if (!one_host.ok()) return one_host.status();

  // Rank 0 hosts the server; everyone learns its address or its failure.
  bool ok = true;
  std::string text;
  if (out.rank == 0) {
    TcpStoreServerOptions server_options;
    server_options.bind_addr = *one_host ? "127.0.0.1" : "0.0.0.0";
    server_options.port = 0;
    auto server = StartTcpStoreServer(server_options);
    if (server.ok()) {
      out.server = *std::move(server);
      text = absl::StrCat(*one_host ? "127.0.0.1" : HostName(), ":",
                          out.server->port());
    } else {
      ok = false;
      text = std::string(server.status().message());
    }
  }
  absl::Status s = BroadcastText(world.get(), out.rank, ok, text);
  if (!s.ok()) return s;
  if (!ok) {
    return absl::UnavailableError(absl::StrCat(
        "MPI rendezvous: rank 0 could not start the store server: ", text));
  }
  const size_t colon = text.rfind(':');
  TcpStoreClientOptions client_options;
  client_options.host = text.substr(0, colon);
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(text.substr(colon + 1), &client_options.port)) {
    return absl::InternalError(absl::StrCat("MPI rendezvous: bad address '", text, "'"));
  }
  client_options.connect_timeout = timeout;
  auto store = ConnectTcpStore(client_options);
  absl::Status mine = store.ok() ? absl::OkStatus() : store.status();

  // Agree on the outcome so that no rank proceeds with a broken peer.
  int connected = mine.ok() ? 1 : 0;
  std::vector<int> all(static_cast<size_t>(out.size));
  rc = MPI_Allgather(&connected, 1, MPI_INT, all.data(), 1, MPI_INT, world.get());
  if (rc != MPI_SUCCESS) return MpiFailure("MPI_Allgather", rc);
  std::vector<int> failed;
  for (int r = 0; r < out.size; ++r) {
    if (all[static_cast<size_t>(r)] == 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "MPI rendezvous: ranks ", absl::StrJoin(failed, ", "), " of ", out.size,
        " could not connect to the store at ", text,
        mine.ok() ? "" : absl::StrCat(" (this rank: ", mine.message(), ")")));
  }
  out.store = *std::move(store);
  return out;
}

}  // namespace fusebox::comm
