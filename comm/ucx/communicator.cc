// UCX backend. See communicator.h for the contract.
//
// Note [UCX collective protocol]
// Collectives run one at a time, in issue order, on whichever thread holds the
// core's executor lock (Note [Who executes a collective] in
// comm/async_core.h): the communicator's progress thread or a caller blocked
// in Wait(). Only that thread touches the UCP worker (UCS_THREAD_MODE_SINGLE,
// serialised by the lock).
// Every collective opens with a round that compares every rank's Header
// (kind, count, type, op, root, sequence number; comm/ucx/header.h), so all
// ranks reach the same verdict on a mismatch: the Work fails on every rank
// with the same message, naming rank 0's call and the lowest rank's that
// differs, before any algorithm moves data, so a mismatch is never a hang or
// a corruption. Which round depends on where the ranks are:
// * On one host, the header round through shared memory (below): every rank
//   reads every rank's header. Payloads of up to small_message_bytes ride
//   along ("one-shot"), which finishes small collectives in a single round;
//   each rank then reduces all contributions in rank order, so every rank
//   computes bit-identical results.
// * Over messages (across hosts; on one host where shared memory is off or
//   did not come up), the descriptor round (Note [Descriptor round] in
//   descriptor_round.h): the headers compared by recursive doubling,
//   about p log2(p) messages instead of p(p-1), carrying AllReduce up to
//   max(small_message_bytes, recursive_doubling_bytes) in the same
//   messages; in worlds of a power of two >= 4 ranks, above
//   rabenseifner_from_bytes up to rabenseifner_bytes as a reduce-scatter in
//   the same exchanges followed by an allgather (Note [Rabenseifner]; Note
//   [Algorithm table]). Where some machine runs more
//   ranks than cores, the linear round instead (Note [Linear round]): every header to rank 0 and
//   its verdict back, 2(p-1) messages.
// Larger AllReduce over messages runs a ring reduce-scatter + allgather,
// pipelined in chunks of chunk_bytes: a chunk received in step k is reduced
// while later chunks are in flight and is sent on in step k+1 as soon as it
// is reduced; received chunks land in a small ring of staging slots that
// stays in cache. Broadcast is a pipelined chain from the root; AllGather
// is a ring.
//
// Large AllReduce between ranks on one host runs over shared memory instead
// (Note [UCX shared-memory allreduce] in shm_allreduce.h) when every rank can
// map every other rank's staging segment: allocated with
// ucp_mem_map(ALLOCATE), published as a packed rkey, mapped with
// ucp_rkey_ptr (UCX's sysv memory domain). The same segments then carry
// the header round too: each rank writes its header (and small payload)
// into a mailbox of its segment and raises one flag, and reads every
// other rank's (Note [Shared-memory exchange] in shm_allreduce.h), so a
// small collective on one host costs a few cache-line transfers instead of
// a round of UCX messages (CheckHeaders compares them).
//
// Messages go through the channel (channel.h: endpoints, tags, waiting
// under the deadline, failure notices); the queue that runs them is the
// shared core's (comm/async_core.h); this file holds the algorithms and
// their execution. The ring's steps reach 2(p-1), hence at most
// ucx::kMaxWorld ranks.
#include "comm/ucx/communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "comm/async_core.h"
#include "comm/fault.h"
#include "comm/reduce.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/descriptor_round.h"
#include "comm/ucx/header.h"
#include "comm/ucx/measured_choice.h"
#include "comm/ucx/ranges.h"
#include "comm/ucx/shm_allreduce.h"

namespace fusebox::comm {
namespace {

using ucx::Algorithm;
using ucx::Kind;
using ucx::Describe;
using ucx::Header;
using ucx::kHeaderMagic;
using ucx::KindName;
using ucx::SameCall;

// The largest header round that goes through shared-memory mailboxes (two
// per rank, in every rank's segment); above it, UCX messages.
constexpr size_t kMaxMailboxBytes = size_t{1} << 20;

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

// One collective being executed: its header (the wire descriptor) and
// buffers.
struct Request {
  Header header{};
  const void* send = nullptr;
  void* recv = nullptr;
};

// Note [Beginning on the issuing thread]
// On one host (the header round through the mailboxes) a non-blocking
// AllReduce issued to an idle communicator is begun by the issuing thread
// (Note [The issuer begins] in comm/async_core.h): Begin builds its header
// round message in the outbox (the header, and the data where it rides in
// the round: kOneShot) and publishes it (ShmPublish), and for the
// shared-memory allreduce stages its first round (ShmBeginAllReduce: up to
// (p - 1) * shm_chunk_bytes of the input copied into this rank's slot and
// published) where the slot is free at once. None of it waits for a peer.
// Start, on the progress thread, collects the round (ShmCollect), compares
// the headers as always (a mismatch is found on every rank, as before), and
// runs the rest. What the issuer did is the data moving: its peers can
// read the message, and reduce the staged round, before this rank's
// progress thread has woken. Begin never runs a kind of call or an
// algorithm it does not know to be one of these (Broadcast, AllGather,
// Barrier, and every path over messages run as before), and a blocking call
// never comes here (it runs on its caller whole, Note [Blocking calls]).
// Where it applies is UcxOptions::issuer_begins (kAuto: where this
// machine's ranks and their progress threads outnumber its cores).
struct Begun {
  uint64_t seq = 0;        // the call's
  uint64_t exchange = 0;   // its header round (ShmCollect)
  bool staged = false;     // its first shared-memory round (ShmBeginAllReduce)
  bool stream = false;     // how it was staged (Note [Choosing how to stage])
  absl::Duration staging;  // how long the staging took, for the chooser
};

using ucx::ChunkOf;
using ucx::MakeTag;
using ucx::Pending;
using ucx::Range;
using ucx::SplitEven;
using ucx::UcsError;

// The queue, the progress thread, sequence numbers, sticky failure and
// deadlines are the shared core's (comm/async_core.h); this class executes
// one collective at a time (Start runs it to its end, so a caller blocked
// in Wait() may run it: callers_execute).
class UcxCommunicator final : public Communicator, private CollectiveExecutor {
 public:
  UcxCommunicator(const UcxOptions& options, int rank, int size, Store& store)
      : options_(options),
        rank_(rank),
        size_(size),
        store_(store),
        core_(CoreOptions(options, rank, size)),
        channel_(rank, size, &core_.aborted()) {}
  ~UcxCommunicator() override;

  absl::Status Init(Store& store);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "ucx"; }
  // The table, then the measured choices made so far (Note [Measured
  // choice]).
  std::string Algorithms() const override {
    std::string text = algorithms_.Describe();
    absl::MutexLock lock(&chosen_mu_);
    if (!chosen_.empty()) {
      absl::StrAppend(&text, "\nChosen: ", absl::StrReplaceAll(chosen_, {{"\n", "; "}}));
    }
    return text;
  }
  std::vector<std::string> SetupNotes() const override {
    if (core_.progress_priority().ok()) return {};
    return {std::string(core_.progress_priority().message())};
  }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  absl::StatusOr<std::shared_ptr<Work>> AllReduce(const void* send, void* recv,
                                                  size_t count, DataType type,
                                                  ReduceOp op) override;
  absl::StatusOr<std::shared_ptr<Work>> Broadcast(void* buf, size_t count,
                                                  DataType type,
                                                  int root) override;
  absl::StatusOr<std::shared_ptr<Work>> AllGather(const void* send, void* recv,
                                                  size_t count,
                                                  DataType type) override;
  absl::StatusOr<std::shared_ptr<Work>> Barrier() override;
  // Note [Blocking calls]: on the calling thread when nothing is ahead.
  absl::Status AllReduceBlocking(const void* send, void* recv, size_t count, DataType type,
                                 ReduceOp op) override {
    return core_.Run(Kind::kAllReduce, send, recv, count, type, op, 0);
  }
  absl::Status BroadcastBlocking(void* buf, size_t count, DataType type, int root) override {
    return core_.Run(Kind::kBroadcast, buf, buf, count, type, ReduceOp::kSum, root);
  }
  absl::Status AllGatherBlocking(const void* send, void* recv, size_t count,
                                 DataType type) override {
    return core_.Run(Kind::kAllGather, send, recv, count, type, ReduceOp::kSum, 0);
  }
  absl::Status BarrierBlocking() override {
    return core_.Run(Kind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8, ReduceOp::kSum, 0);
  }

 private:
  static AsyncCoreOptions CoreOptions(const UcxOptions& o, int rank, int size) {
    AsyncCoreOptions c;
    c.backend = "UCX";
    c.rank = rank;
    c.size = size;
    c.timeout = o.timeout;
    c.idle_spin = o.progress_spin;
    c.callers_execute = true;
    c.on_stop = AsyncCoreOptions::OnStop::kCancel;
    return c;
  }
  // CollectiveExecutor: runs `call` to its end; every error is fatal.
  StartOutcome Start(CollectiveCall& call) override;
  // Note [Beginning on the issuing thread].
  bool Begin(CollectiveCall& call) override;
  Request MakeRequest(const CollectiveCall& call) const;
  // Never called: nothing stays in flight after Start.
  absl::Status TimedOut(const CollectiveCall& oldest) override;
  // The error of a collective that timed out (or was abandoned by a peer
  // that did): what, on whom, and the post-mortem (Note [Timeout
  // post-mortem]).
  absl::Status WithPostMortem(const Header& h, const absl::Status& s);
  // `begun`: what Begin did for this call (null: nothing).
  absl::Status Run(const Request& req, const Begun* begun);

  absl::Status HeaderRound(const Request& req, size_t payload_bytes, const void* payload,
                           const Begun* begun);
  // The header round's message (the header, then `payload_bytes` of
  // `payload`) built at `mine`.
  static void BuildMessage(unsigned char* mine, const Request& req, size_t payload_bytes,
                           const void* payload);
  absl::Status RingAllReduce(const Request& req);
  absl::Status ChainBroadcast(const Request& req);
  absl::Status RingAllGather(const Request& req);
  void SmallAllReduce(const Request& req);

  const UcxOptions options_;
  const int rank_;
  const int size_;
  Store& store_;  // outlives the communicator; used again only by a post-mortem

  // The header round's message on one rank (Header + small_bytes_); with
  // several, every rank's message is read where it arrived.
  size_t slot_bytes_ = 0;
  std::vector<unsigned char> header_slots_;
  // Every rank's header-round message (a Header, then its payload) once the
  // round is done: in the mailboxes (Note [Reading the mailboxes in place]
  // in shm_allreduce.h), or header_slots_ on one rank. Valid until the next
  // header round.
  std::vector<const unsigned char*> received_;
  // Ring staging: `kRingSlots` chunks.
  static constexpr int kRingSlots = 8;
  std::vector<unsigned char> ring_slots_;
  // The descriptor round's messages (Note [Descriptor round]): grow to the
  // table's carried_bytes and the largest AllReduce carried.
  ucx::DescriptorStaging descriptor_staging_;
  // Note [Measured choice]: built with the table; the executing thread's.
  std::optional<ucx::MeasuredChoice> measured_;
  // Its Describe(), for Algorithms() on any thread.
  mutable absl::Mutex chosen_mu_;
  std::string chosen_ ABSL_GUARDED_BY(chosen_mu_);

  // Shared-memory path (Note [UCX shared-memory allreduce]).
  absl::Status InitSharedMemory(Store& store);
  // Compares the headers in received_ (Note [UCX collective protocol]).
  absl::Status CheckHeaders() const;
  absl::Status ShmAllReduce(const Request& req, const Begun* begun);
  // Whether this rank's next shared-memory allreduce of `bytes` stages with
  // streaming stores (UcxOptions::shm_stores; kAuto asks the chooser, once
  // per collective).
  bool StreamsInto(size_t bytes) {
    return options_.shm_stores == UcxOptions::ShmStores::kStreamed ||
           (options_.shm_stores == UcxOptions::ShmStores::kAuto && staging_.Stream(bytes));
  }
  bool shm_enabled_ = false;
  // The call Begin began, until Start takes it (executor lock).
  std::optional<Begun> begun_;
  std::string store_prefix_;  // keys of this communicator's exchanges
  ucp_mem_h shm_memh_ = nullptr;
  ucx::ShmGroup shm_group_;                   // every rank's segment, mapped here
  std::vector<ucp_rkey_h> shm_rkeys_;
  uint64_t shm_round_ = 0;                    // rounds staged (all ranks agree)
  ucx::StagingChooser staging_;               // Note [Choosing how to stage]
  // The header round through the segments' mailboxes (Note [Shared-memory
  // exchange] in shm_allreduce.h) when every rank has them.
  bool shm_exchange_ = false;
  // Note [Algorithm table]; built in Init, the same on every rank.
  ucx::AlgorithmTable algorithms_;
  // Payloads of up to this many bytes ride in the header round: the
  // table's one-shot threshold (before Init's end, the one the mailboxes are
  // sized for).
  size_t small_bytes_ = 0;
  uint64_t shm_exchanges_ = 0;                // exchanges completed (all ranks agree)
  std::vector<size_t> exchange_lengths_;

  // A collective failed for any reason but a mismatch (a peer may be dead
  // or stuck): the endpoints close without a flush.
  std::atomic<bool> peer_trouble_{false};
  // Issue, queue, progress thread, sticky failure, deadlines (Note
  // [Asynchronous core]). Before channel_, whose waits read its abort flag.
  AsyncCore core_;
  // Endpoints, tags, waits and failure notices (executor only).
  ucx::Channel channel_;
};

// ---------------------------------------------------------------------------
// Setup and teardown.

absl::Status UcxCommunicator::Init(Store& store) {
  absl::StatusOr<std::string> address = channel_.Open(options_, options_.use_shared_memory);
  if (!address.ok()) return address.status();
  // Published: [u32 length][the options that decide the algorithms]
  // [u32 length][this machine's boot id][u32 length][its cores, decimal]
  // [address]. Ranks whose options differ would pick different algorithms
  // and hang, so a difference is an error naming both ranks. The boot id
  // tells which ranks share a machine (and its cores), network namespaces
  // included.
  const std::string settings_text = absl::StrCat(
      "small_message_bytes=", options_.small_message_bytes,
      " recursive_doubling_bytes=", options_.recursive_doubling_bytes,
      " rabenseifner_bytes=", options_.rabenseifner_bytes,
      " rabenseifner_from_bytes=", options_.rabenseifner_from_bytes,
      " chunk_bytes=", options_.chunk_bytes, " use_shared_memory=", options_.use_shared_memory,
      " shm_chunk_bytes=", options_.shm_chunk_bytes,
      " shm_stores=", static_cast<int>(options_.shm_stores), " transports=", options_.transports,
      " detect_peer_failure=", options_.detect_peer_failure,
      " opening=", static_cast<int>(options_.opening), " linear_bytes=", options_.linear_bytes,
      " measured_choice_bytes=", options_.measured_choice_bytes);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::string mine;
  for (const std::string& field : {settings_text, MachineId(), absl::StrCat(cores)}) {
    const uint32_t len = static_cast<uint32_t>(field.size());
    mine.append(reinterpret_cast<const char*>(&len), sizeof(len));
    mine += field;
  }
  mine += *address;

  // Every exchange gets keys of its own: "ucx/<n>/<what>/<rank>", where n
  // counts this rank's UCX communicators on the store (the same on all ranks,
  // which create communicators in the same order).
  auto instance = store.Add(absl::StrCat("ucx/instances/", rank_), 1);
  if (!instance.ok()) return instance.status();
  store_prefix_ = absl::StrCat("ucx/", *instance);
  PrefixStore scoped(store_prefix_ + "/addr", store);
  auto all = StoreAllGather(scoped, "ucx/addr", rank_, size_, mine,
                            absl::Now() + options_.rendezvous_timeout);
  if (!all.ok()) return all.status();

  std::vector<std::string> configs(size_), machines(size_), addresses(size_);
  std::vector<unsigned> machine_cores(size_);
  for (int r = 0; r < size_; ++r) {
    absl::string_view rest = (*all)[r];
    std::string cores_text;
    if (!TakeField(&rest, &configs[r]) || !TakeField(&rest, &machines[r]) ||
        !TakeField(&rest, &cores_text) || !absl::SimpleAtoi(cores_text, &machine_cores[r]) ||
        machine_cores[r] == 0) {
      return absl::DataLossError(absl::StrCat("rank ", r,
                                              " published a malformed UCX rendezvous record (",
                                              (*all)[r].size(), " bytes)"));
    }
    addresses[r] = std::string(rest);
  }
  for (int r = 1; r < size_; ++r) {
    if (configs[r] != configs[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "UCX options differ across ranks: rank 0 has {", configs[0], "} but rank ", r,
          " has {", configs[r], "}"));
    }
  }
  if (absl::Status s = channel_.Connect(addresses, options_.detect_peer_failure); !s.ok()) {
    return s;
  }

  // Ranks on rank r's machine: those with its boot id, or all where it is
  // unknown. Every rank computes the same for every rank.
  absl::flat_hash_map<std::string, int> ranks_on;
  for (const std::string& m : machines) ++ranks_on[m];
  const auto ranks_at = [&](int r) {
    return static_cast<unsigned>(machines[r].empty() ? size_ : ranks_on[machines[r]]);
  };
  const auto oversubscribed_at = [&](int r) { return ranks_at(r) > machine_cores[r]; };
  const bool oversubscribed = oversubscribed_at(rank_);
  bool any_oversubscribed = false;
  for (int r = 0; r < size_; ++r) any_oversubscribed = any_oversubscribed || oversubscribed_at(r);
  // Polls without progress between sched_yield calls: very often when ranks
  // outnumber cores (a descheduled peer must get to run), rarely otherwise.
  // (Unbound ranks can still share a core by the scheduler's choice, which
  // makes small collectives bimodal; fusebox-run binds ranks when they fit.)
  // Where the transports are TCP only, an oversubscribed rank yields at
  // each idle poll and, after kYieldsBeforeSleep of them in a row, sleeps on
  // the worker's event fd (Note [Waiting where ranks outnumber cores] in
  // channel.h): each poll of a TCP worker is an epoll_wait, and a rank that
  // sleeps leaves the core to those with work.
  constexpr unsigned kYieldsBeforeSleep = 4;
  channel_.set_yield_mask(oversubscribed ? 15 : 1023);
  channel_.set_sleep_when_idle(oversubscribed, kYieldsBeforeSleep);
  // Note [Algorithm table]. The mailboxes are sized for the threshold the
  // shared-memory exchange would give; all ranks of a shared-memory group
  // share the host, so they agree (and the segment layout check makes them
  // fall back together if they do not). The table is final once it is known
  // whether shared memory came up.
  ucx::AlgorithmInputs inputs;
  inputs.world = size_;
  inputs.cores = cores;
  inputs.small_message_bytes = options_.small_message_bytes;
  inputs.recursive_doubling_bytes = options_.recursive_doubling_bytes;
  inputs.rabenseifner_bytes = options_.rabenseifner_bytes;
  inputs.rabenseifner_from_bytes = options_.rabenseifner_from_bytes;
  inputs.opening = options_.opening;
  inputs.linear_bytes = options_.linear_bytes;
  inputs.machine_oversubscribed = any_oversubscribed;
  inputs.measured_bytes = options_.measured_choice_bytes;
  inputs.shm_exchange = true;
  small_bytes_ = ucx::SmallMessageBytes(inputs);

  // The shared-memory path cannot notice a dead peer; a user who asked for
  // peer-failure detection gets the (TCP) messaging path only.
  if (options_.use_shared_memory && !options_.detect_peer_failure && size_ > 1 &&
      options_.transports == UcxOptions{}.transports) {
    if (absl::Status s = InitSharedMemory(store); !s.ok()) return s;
  }
  inputs.shm_exchange = shm_exchange_;
  inputs.shm_allreduce = shm_enabled_;
  algorithms_ = ucx::BuildAlgorithmTable(inputs);
  measured_.emplace(algorithms_.measured(), /*decides=*/rank_ == 0);
  small_bytes_ = algorithms_.small_bytes();
  // Oversubscribed, 4 ranks bound two to a core: 8 B allreduce 23-25 ->
  // 20-21 us, 128 KiB 65-90 -> 50-77 us.
  shm_group_.yield_mask = oversubscribed ? 0 : 255;
  slot_bytes_ = sizeof(Header) + small_bytes_;
  // The header round's message on one rank; with several on one host it is
  // built and read in the mailboxes, and over messages the descriptor
  // round's staging grows on use.
  if (size_ == 1) header_slots_.resize(slot_bytes_);
  ring_slots_.resize(options_.chunk_bytes * kRingSlots);
  // Note [Beginning on the issuing thread]: kAuto where this rank's
  // machine has fewer cores than its ranks' callers and progress threads.
  const bool issuer_begins =
      shm_exchange_ && (options_.issuer_begins == UcxOptions::IssuerBegins::kOn ||
                        (options_.issuer_begins == UcxOptions::IssuerBegins::kAuto &&
                         2 * ranks_at(rank_) > machine_cores[rank_]));
  core_.Start(this, oversubscribed ? 0 : options_.progress_nice,
              oversubscribed ? absl::ZeroDuration() : options_.progress_slice, issuer_begins);
  return absl::OkStatus();
}

UcxCommunicator::~UcxCommunicator() {
  // In-flight and queued collectives end as Cancelled; the progress thread
  // is joined.
  core_.Stop();
  // Remote keys go before the endpoints they were unpacked on (ucp.h).
  for (ucp_rkey_h& k : shm_rkeys_) {
    if (k != nullptr) ucp_rkey_destroy(k);
    k = nullptr;
  }
  // After a failure a peer may be dead or stuck: no flush that waits on it.
  // A mismatch leaves every peer alive and maybe still waiting for this
  // rank's last message (the descriptor round's hand-back): flush it.
  channel_.Close(/*force=*/peer_trouble_.load() || core_.cancelled_any());
  if (shm_memh_ != nullptr) ucp_mem_unmap(channel_.context(), shm_memh_);
  // channel_'s destructor then destroys the worker and the context.
}

// ---------------------------------------------------------------------------
// Issue side (any thread).

absl::StatusOr<std::shared_ptr<Work>> UcxCommunicator::AllReduce(
    const void* send, void* recv, size_t count, DataType type, ReduceOp op) {
  return core_.Issue(Kind::kAllReduce, send, recv, count, type, op, 0);
}

absl::StatusOr<std::shared_ptr<Work>> UcxCommunicator::Broadcast(
    void* buf, size_t count, DataType type, int root) {
  return core_.Issue(Kind::kBroadcast, buf, buf, count, type, ReduceOp::kSum, root);
}

absl::StatusOr<std::shared_ptr<Work>> UcxCommunicator::AllGather(
    const void* send, void* recv, size_t count, DataType type) {
  return core_.Issue(Kind::kAllGather, send, recv, count, type, ReduceOp::kSum, 0);
}

absl::StatusOr<std::shared_ptr<Work>> UcxCommunicator::Barrier() {
  return core_.Issue(Kind::kBarrier, nullptr, nullptr, 0, DataType::kUInt8, ReduceOp::kSum, 0);
}

// ---------------------------------------------------------------------------
// Execution (the core's executing thread, Note [Asynchronous core]).

Request UcxCommunicator::MakeRequest(const CollectiveCall& call) const {
  Request req;
  req.header.magic = kHeaderMagic;
  req.header.kind = static_cast<uint8_t>(call.kind);
  req.header.type = static_cast<uint8_t>(call.type);
  req.header.op = static_cast<uint8_t>(call.op);
  req.header.root = call.root;
  req.header.sender = rank_;
  req.header.count = call.count;
  req.header.seq = call.seq;
  req.send = call.send;
  req.recv = call.recv;
  return req;
}

bool UcxCommunicator::Begin(CollectiveCall& call) {
  // Only the header round through the mailboxes, and only AllReduce by the
  // table's one-shot or shared-memory algorithm (no measured classes there).
  if (!shm_exchange_ || size_ < 2 || call.kind != Kind::kAllReduce || begun_.has_value() ||
      measured_->classes() > 0) {
    return false;
  }
  const Request req = MakeRequest(call);
  const size_t bytes = call.count * DataTypeSize(call.type);
  const Algorithm algorithm = algorithms_.Select(Kind::kAllReduce, bytes);
  if (algorithm != Algorithm::kOneShot && algorithm != Algorithm::kShmAllReduce) return false;
  const size_t payload_bytes = algorithm == Algorithm::kOneShot ? bytes : 0;
  const size_t message_bytes = sizeof(Header) + payload_bytes;
  if (message_bytes > shm_group_.mailbox_bytes) return false;  // Start says why
  BuildMessage(ucx::ShmOutbox(shm_group_, shm_exchanges_), req, payload_bytes, req.send);
  absl::StatusOr<uint64_t> exchange = ucx::ShmPublish(shm_group_, message_bytes, &shm_exchanges_);
  if (!exchange.ok()) return false;  // unreachable: the size was checked
  Begun b;
  b.seq = call.seq;
  b.exchange = *exchange;
  if (algorithm == Algorithm::kShmAllReduce) {
    b.stream = StreamsInto(bytes);
    shm_group_.stream_bytes = b.stream ? ucx::kStreamMinCopyBytes : 0;
    const auto start = std::chrono::steady_clock::now();
    b.staged = ucx::ShmBeginAllReduce(shm_group_, req.send, call.count, call.type, &shm_round_);
    b.staging = absl::FromChrono(std::chrono::steady_clock::now() - start);
  }
  begun_ = b;
  return true;
}

StartOutcome UcxCommunicator::Start(CollectiveCall& call) {
  Request req = MakeRequest(call);
  // Note [Measured choice]: rank 0's decisions ride in its header, in
  // every round over messages.
  if (!shm_exchange_ && size_ > 1) req.header.pad = measured_->TakeAnnouncement();
  std::optional<Begun> begun;
  if (call.begun) {
    begun.swap(begun_);
    if (!begun.has_value() || begun->seq != call.seq) {
      StartOutcome o;
      o.fatal = true;
      o.status = absl::InternalError(
          absl::StrCat("UCX collective #", call.seq, " was begun, but not by this communicator"));
      return o;
    }
  }
  channel_.set_deadline(call.deadline);
  absl::Status s = Run(req, begun.has_value() ? &*begun : nullptr);
  channel_.set_deadline(absl::InfiniteFuture());
  // A timeout here, a peer's (which abandons the shared-memory allreduce),
  // or an endpoint failure (the peer may have left because of a third
  // rank): find out who is gone.
  if (!s.ok() && !absl::IsInvalidArgument(s)) peer_trouble_.store(true);
  if (!s.ok() && (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s))) {
    channel_.NotifyPeers(req.header.seq);  // first, so that peers stop waiting at once
  }
  if (!s.ok() && (absl::IsDeadlineExceeded(s) || absl::IsAborted(s) || absl::IsUnavailable(s))) {
    s = WithPostMortem(req.header, s);
  }
  StartOutcome o;
  o.fatal = !s.ok();
  o.status = std::move(s);
  return o;
}

absl::Status UcxCommunicator::TimedOut(const CollectiveCall& oldest) {
  return absl::InternalError(absl::StrCat("UCX collective #", oldest.seq,
                                          " was left in flight, which this backend never does"));
}

absl::Status UcxCommunicator::WithPostMortem(const Header& h, const absl::Status& s) {
  const std::string doing = absl::StrCat(Describe(h), ": ", s.message());
  // Peers that time out on the same collective do so within about the
  // grace of each other; a rank that learnt of the failure from a peer
  // (Aborted, Unavailable) mostly finds their reports already there.
  const absl::Duration grace =
      absl::IsDeadlineExceeded(s) ? PostMortemGrace(options_.timeout)
                                  : std::min(PostMortemGrace(options_.timeout), absl::Seconds(2));
  const std::string post_mortem = TimeoutPostMortem(store_, store_prefix_, rank_, size_, doing,
                                                    grace, PostMortemStay(options_.timeout));
  const std::string timed_out =
      absl::IsDeadlineExceeded(s)
          ? absl::StrCat(" (timed out after ", absl::FormatDuration(options_.timeout), ")")
          : "";
  return absl::Status(s.code(), absl::StrCat("rank ", rank_, ": UCX ", doing, timed_out, "; ",
                                             post_mortem));
}

absl::Status UcxCommunicator::Run(const Request& req, const Begun* begun) {
  const Header& h = req.header;
  const Kind kind = static_cast<Kind>(h.kind);
  const DataType type = static_cast<DataType>(h.type);
  const size_t bytes = h.count * DataTypeSize(type);
  Algorithm algorithm = algorithms_.Select(kind, bytes);
  // Note [Measured choice]: in a measured class, the trial's candidate or
  // the one chosen.
  std::optional<ucx::MeasuredChoice::Pick> pick;
  if (kind == Kind::kAllReduce) pick = measured_->Next(bytes);
  if (pick.has_value()) algorithm = pick->algorithm;
  // Only rank 0 times (and only where classes are measured).
  const bool timed = rank_ == 0 && measured_->classes() > 0;
  const absl::Time began = timed ? absl::Now() : absl::InfinitePast();
  // What this rank contributes to the header round.
  size_t payload_bytes = 0;
  const void* payload = nullptr;
  if (algorithm == Algorithm::kOneShot &&
      (kind != Kind::kBroadcast || h.root == rank_)) {
    payload_bytes = bytes;
    payload = req.send;
  }
  if (!shm_exchange_ && size_ > 1) {
    // Note [Descriptor round]: instead of the header round, and carrying
    // the AllReduce the table (or the measured choice) gives it.
    // The linear round where it opens collectives (Note [Linear round]) or
    // carries this AllReduce; otherwise the descriptor round, with the
    // linear round watched beside it where the linear round opens or may
    // carry a measured class (Note [Watching the linear round]).
    const bool halving = algorithm == Algorithm::kRabenseifnerAllReduce;
    const ucx::Carried carried{req.send, req.recv, halving};
    const bool in_round = algorithm == Algorithm::kRecursiveDoublingAllReduce || halving;
    const bool carries = algorithm == Algorithm::kLinearAllReduce;
    absl::Status s =
        carries || (algorithms_.linear() && !in_round)
            ? ucx::LinearRound(channel_, h, carries ? &carried : nullptr,
                               algorithms_.linear_bytes(), &descriptor_staging_)
            : ucx::DescriptorRound(channel_, h, in_round ? &carried : nullptr,
                                   algorithms_.carried_bytes(), &descriptor_staging_,
                                   algorithms_.linear_watched()
                                       ? static_cast<int64_t>(algorithms_.linear_bytes())
                                       : -1);
    // A clean round ends with rank 0's header on every rank, and any
    // decision it announces applies from the next collective.
    if (s.ok() && descriptor_staging_.rank0_pad != 0) {
      s = measured_->Apply(descriptor_staging_.rank0_pad);
      const std::string chosen = measured_->Describe();
      absl::MutexLock lock(&chosen_mu_);
      chosen_ = chosen;
    }
    if (!s.ok()) return s;
    if (in_round || carries) {
      if (timed) measured_->Record(pick, began, absl::Now());
      return absl::OkStatus();
    }
    // What follows the round is not measured, unless a measured class runs
    // the ring (or the shared-memory allreduce) after it: that call is timed
    // to its end below. Otherwise the next call is timed from its own start.
    if (timed && !pick.has_value()) measured_->Record(std::nullopt, began, absl::Now());
  } else if (absl::Status s = HeaderRound(req, payload_bytes, payload, begun); !s.ok()) {
    return s;
  }

  const auto slot = [&](int r) { return received_[r] + sizeof(Header); };
  switch (algorithm) {
    case Algorithm::kNone:
      return absl::OkStatus();
    case Algorithm::kLocal:  // one rank: nothing to exchange
      if (kind == Kind::kAllReduce) {
        if (req.recv != req.send) std::memcpy(req.recv, req.send, bytes);
        if (static_cast<ReduceOp>(h.op) == ReduceOp::kAvg) FinishAvg(req.recv, h.count, type, 1);
      } else if (kind == Kind::kAllGather && req.recv != req.send) {
        std::memmove(req.recv, req.send, bytes);
      }
      return absl::OkStatus();
    case Algorithm::kOneShot:
      switch (kind) {
        case Kind::kAllReduce:
          SmallAllReduce(req);
          break;
        case Kind::kBroadcast:
          if (rank_ != h.root && bytes > 0) std::memcpy(req.recv, slot(h.root), bytes);
          break;
        case Kind::kAllGather: {
          auto* out = static_cast<unsigned char*>(req.recv);
          for (int r = 0; r < size_; ++r) {
            if (bytes > 0) std::memmove(out + r * bytes, slot(r), bytes);
          }
          break;
        }
        case Kind::kBarrier:
          break;
      }
      return absl::OkStatus();
    case Algorithm::kShmAllReduce:
    case Algorithm::kRingAllReduce: {
      absl::Status s =
          algorithm == Algorithm::kShmAllReduce ? ShmAllReduce(req, begun) : RingAllReduce(req);
      if (timed && pick.has_value()) measured_->Record(pick, began, absl::Now());
      return s;
    }
    case Algorithm::kRecursiveDoublingAllReduce:  // done in the descriptor round
    case Algorithm::kRabenseifnerAllReduce:       // done in the descriptor round
    case Algorithm::kLinearAllReduce:             // done in the linear round
      return absl::OkStatus();
    case Algorithm::kChainBroadcast:
      return ChainBroadcast(req);
    case Algorithm::kRingAllGather:
      return RingAllGather(req);
  }
  return absl::InternalError("unknown algorithm");
}

// ---------------------------------------------------------------------------
// Algorithms.

void UcxCommunicator::BuildMessage(unsigned char* mine, const Request& req, size_t payload_bytes,
                                   const void* payload) {
  std::memcpy(mine, &req.header, sizeof(Header));
  if (payload_bytes > 0) std::memcpy(mine + sizeof(Header), payload, payload_bytes);
}

absl::Status UcxCommunicator::HeaderRound(const Request& req, size_t payload_bytes,
                                          const void* payload, const Begun* begun) {
  const size_t message_bytes = sizeof(Header) + payload_bytes;
  if (size_ == 1) {
    BuildMessage(header_slots_.data(), req, payload_bytes, payload);
    received_.assign(1, header_slots_.data());
    return absl::OkStatus();
  }
  // Over messages the descriptor round opens instead (Run).
  if (!shm_exchange_) return absl::InternalError("header round over messages");
  if (message_bytes > shm_group_.mailbox_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("header round: ", message_bytes,
                                                   " bytes do not fit a mailbox of ",
                                                   shm_group_.mailbox_bytes));
  }
  // One write and one flag per rank (Note [Shared-memory exchange]); the
  // message is built in the mailbox and every rank's read where it arrived
  // (Note [Reading the mailboxes in place]). A begun call's is published
  // already (Note [Beginning on the issuing thread]).
  uint64_t exchange = 0;
  if (begun != nullptr) {
    exchange = begun->exchange;
  } else {
    BuildMessage(ucx::ShmOutbox(shm_group_, shm_exchanges_), req, payload_bytes, payload);
    absl::StatusOr<uint64_t> n = ucx::ShmPublish(shm_group_, message_bytes, &shm_exchanges_);
    if (!n.ok()) return n.status();
    exchange = *n;
  }
  if (absl::Status s = ucx::ShmCollect(shm_group_, exchange, &received_, &exchange_lengths_,
                                       core_.aborted(), channel_.deadline());
      !s.ok()) {
    return s;
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (exchange_lengths_[peer] < sizeof(Header)) {
      return absl::DataLossError(absl::StrCat("rank ", peer, " sent a short header (",
                                              exchange_lengths_[peer], " bytes)"));
    }
  }
  return CheckHeaders();
}

absl::Status UcxCommunicator::CheckHeaders() const {
  // Every rank compares every header with rank 0's, so all reach the same
  // verdict with the same message.
  Header ref;
  std::memcpy(&ref, received_[0], sizeof(Header));
  for (int r = 0; r < size_; ++r) {
    Header h;
    std::memcpy(&h, received_[r], sizeof(Header));
    if (h.magic != kHeaderMagic || h.sender != r) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a malformed collective header"));
    }
    // The descriptor round's message for the same finding (ref is rank 0's).
    if (!SameCall(h, ref)) return ucx::VerdictStatus(ucx::Verdict{ref, h});
  }
  return absl::OkStatus();
}

void UcxCommunicator::SmallAllReduce(const Request& req) {
  const Header& h = req.header;
  const DataType type = static_cast<DataType>(h.type);
  const ReduceOp op = static_cast<ReduceOp>(h.op);
  const size_t bytes = h.count * DataTypeSize(type);
  if (bytes == 0) return;
  const auto slot = [&](int r) { return received_[r] + sizeof(Header); };
  // Rank order on every rank: bit-identical results everywhere. Own data is
  // read from the slot (a copy), so in-place is safe.
  if (size_ == 1) {
    std::memcpy(req.recv, slot(0), bytes);
  } else {
    Reduce(slot(0), slot(1), req.recv, h.count, type, op);
    for (int r = 2; r < size_; ++r) Reduce(req.recv, slot(r), req.recv, h.count, type, op);
  }
  if (op == ReduceOp::kAvg) FinishAvg(req.recv, h.count, type, size_);
}

absl::Status UcxCommunicator::RingAllReduce(const Request& req) {
  const Header& h = req.header;
  const DataType type = static_cast<DataType>(h.type);
  const ReduceOp op = static_cast<ReduceOp>(h.op);
  const size_t esize = DataTypeSize(type);
  const int p = size_;
  const int next = (rank_ + 1) % p, prev = (rank_ - 1 + p) % p;
  const auto* in = static_cast<const unsigned char*>(req.send);
  auto* out = static_cast<unsigned char*>(req.recv);
  const std::vector<Range> seg = SplitEven(h.count, esize, p);
  const size_t chunk = std::max(esize, options_.chunk_bytes / esize * esize);
  size_t max_seg = 0;
  for (const Range& r : seg) max_seg = std::max(max_seg, r.len);
  const size_t nchunks = (max_seg + chunk - 1) / chunk;
  const uint64_t seq = h.seq;
  const auto mod = [p](int x) { return ((x % p) + p) % p; };

  // Receives in the order they are consumed: RS steps 0..p-2, then AG steps
  // 0..p-2, chunk-major within a step. Step s of the tag is 1 + index.
  const int rs_steps = p - 1, steps = 2 * (p - 1);
  const auto recv_range = [&](int step, size_t j) {
    const int s = step < rs_steps ? mod(rank_ - step - 1) : mod(rank_ - (step - rs_steps));
    return ChunkOf(seg[s], chunk, j);
  };
  const auto send_range = [&](int step, size_t j) {
    const int s = step < rs_steps ? mod(rank_ - step) : mod(rank_ + 1 - (step - rs_steps));
    return ChunkOf(seg[s], chunk, j);
  };

  std::deque<Pending> sends;  // stable addresses
  absl::Status first;
  const auto send = [&](int step, size_t j, const unsigned char* base) {
    const Range r = send_range(step, j);
    if (r.len == 0) return;
    sends.emplace_back();
    channel_.PostSend(next, base + r.off, r.len, MakeTag(seq, 1 + step, j), &sends.back());
  };
  // Reap finished sends from the front so the deque stays short.
  const auto reap = [&]() {
    while (!sends.empty() && sends.front().done) {
      if (sends.front().request != nullptr) ucp_request_free(sends.front().request);
      if (sends.front().status != UCS_OK && first.ok()) {
        first = absl::UnavailableError(absl::StrCat(
            "UCX ring send failed: ", UcsError(sends.front().status)));
      }
      sends.pop_front();
    }
  };

  // Reduce-scatter step 0 sends straight from the input.
  for (size_t j = 0; j < nchunks; ++j) send(0, j, in);

  const size_t total = static_cast<size_t>(steps) * nchunks;
  const size_t window = kRingSlots;
  std::vector<Pending> recvs(window);
  std::vector<int> slot_step(window, -1);
  const auto post = [&](size_t idx) {
    const int step = static_cast<int>(idx / nchunks);
    const size_t j = idx % nchunks;
    const size_t w = idx % window;
    const Range r = recv_range(step, j);
    slot_step[w] = step;
    if (r.len == 0) {
      recvs[w] = Pending{};
      recvs[w].done = true;
      return;
    }
    unsigned char* dst = step < rs_steps ? ring_slots_.data() + w * options_.chunk_bytes
                                         : out + r.off;
    channel_.PostRecv(prev, dst, r.len, MakeTag(seq, 1 + step, j), &recvs[w]);
  };
  size_t posted = 0;
  for (; posted < std::min(window, total); ++posted) post(posted);

  for (size_t idx = 0; idx < total; ++idx) {
    const int step = static_cast<int>(idx / nchunks);
    const size_t j = idx % nchunks;
    const size_t w = idx % window;
    if (absl::Status s = channel_.Finish(&recvs[w], "ring receive"); !s.ok()) {
      first = s;
      break;
    }
    const Range r = recv_range(step, j);
    if (r.len != 0 && recvs[w].length != r.len) {
      first = absl::DataLossError(absl::StrCat("ring step ", step, " chunk ", j, ": got ",
                                               recvs[w].length, " bytes, expected ", r.len));
      break;
    }
    if (step < rs_steps && r.len != 0) {
      // out = in (op) received; in-place safe: each segment is written once.
      const unsigned char* staged = ring_slots_.data() + w * options_.chunk_bytes;
      Reduce(in + r.off, staged, out + r.off, r.len / esize, type, op);
      if (step == rs_steps - 1 && op == ReduceOp::kAvg) {
        FinishAvg(out + r.off, r.len / esize, type, p);
      }
    }
    // The slot is free again: keep the window full before sending on.
    if (posted < total) post(posted++);
    if (step + 1 < steps) send(step + 1, j, out);
    reap();
    if (!first.ok()) break;
  }
  // Drain outstanding sends (and receives, on error) before the buffers can
  // be reused by the caller.
  while (!sends.empty() && first.ok()) {
    if (absl::Status s = channel_.WaitFor(&sends.front()); !s.ok()) first = s;
    reap();
  }
  if (!first.ok()) {
    for (Pending& r : recvs) channel_.Release(&r, /*is_recv=*/true);
    for (Pending& snd : sends) channel_.Release(&snd, /*is_recv=*/false);
  }
  return first;
}

absl::Status UcxCommunicator::ChainBroadcast(const Request& req) {
  const Header& h = req.header;
  const size_t bytes = h.count * DataTypeSize(static_cast<DataType>(h.type));
  const int p = size_;
  const int pos = (rank_ - h.root + p) % p;  // position along the chain
  const int next = (rank_ + 1) % p;
  const bool has_next = pos != p - 1;
  auto* buf = static_cast<unsigned char*>(req.recv);
  const size_t chunk = options_.chunk_bytes;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  const Range all{0, bytes};
  std::deque<Pending> sends;
  std::vector<Pending> recvs(nchunks);
  if (pos != 0) {
    for (size_t j = 0; j < nchunks; ++j) {
      const Range r = ChunkOf(all, chunk, j);
      channel_.PostRecv((rank_ - 1 + p) % p, buf + r.off, r.len, MakeTag(h.seq, 1, j), &recvs[j]);
    }
  }
  absl::Status first;
  for (size_t j = 0; j < nchunks && first.ok(); ++j) {
    const Range r = ChunkOf(all, chunk, j);
    if (pos != 0) first = channel_.Finish(&recvs[j], "broadcast receive");
    if (first.ok() && has_next) {
      sends.emplace_back();
      channel_.PostSend(next, buf + r.off, r.len, MakeTag(h.seq, 1, j), &sends.back());
    }
  }
  for (Pending& s : sends) {
    if (!first.ok()) break;
    first = channel_.Finish(&s, "broadcast send");
  }
  if (!first.ok()) {
    for (Pending& r : recvs) channel_.Release(&r, /*is_recv=*/true);
    for (Pending& snd : sends) channel_.Release(&snd, /*is_recv=*/false);
  }
  return first;
}

absl::Status UcxCommunicator::RingAllGather(const Request& req) {
  const Header& h = req.header;
  const size_t bytes = h.count * DataTypeSize(static_cast<DataType>(h.type));
  const int p = size_;
  const int next = (rank_ + 1) % p;
  auto* out = static_cast<unsigned char*>(req.recv);
  if (out + rank_ * bytes != req.send) std::memmove(out + rank_ * bytes, req.send, bytes);
  const size_t chunk = options_.chunk_bytes;
  const size_t nchunks = (bytes + chunk - 1) / chunk;
  const auto block = [&](int step) {  // the block received at `step`
    return Range{static_cast<size_t>((rank_ - 1 - step + 2 * p) % p) * bytes, bytes};
  };
  std::deque<Pending> sends;
  std::vector<Pending> recvs(static_cast<size_t>(p - 1) * nchunks);
  for (int step = 0; step < p - 1; ++step) {
    for (size_t j = 0; j < nchunks; ++j) {
      const Range r = ChunkOf(block(step), chunk, j);
      channel_.PostRecv((rank_ - 1 + p) % p, out + r.off, r.len, MakeTag(h.seq, 1 + step, j),
                        &recvs[step * nchunks + j]);
    }
  }
  const Range own{static_cast<size_t>(rank_) * bytes, bytes};
  for (size_t j = 0; j < nchunks; ++j) {
    const Range r = ChunkOf(own, chunk, j);
    sends.emplace_back();
    channel_.PostSend(next, out + r.off, r.len, MakeTag(h.seq, 1, j), &sends.back());
  }
  absl::Status first;
  for (int step = 0; step < p - 1 && first.ok(); ++step) {
    for (size_t j = 0; j < nchunks && first.ok(); ++j) {
      first = channel_.Finish(&recvs[step * nchunks + j], "allgather receive");
      if (first.ok() && step + 1 < p - 1) {
        const Range r = ChunkOf(block(step), chunk, j);
        sends.emplace_back();
        channel_.PostSend(next, out + r.off, r.len, MakeTag(h.seq, 2 + step, j), &sends.back());
      }
    }
  }
  for (Pending& s : sends) {
    if (!first.ok()) break;
    first = channel_.Finish(&s, "allgather send");
  }
  if (!first.ok()) {
    for (Pending& r : recvs) channel_.Release(&r, /*is_recv=*/true);
    for (Pending& snd : sends) channel_.Release(&snd, /*is_recv=*/false);
  }
  return first;
}


// ---------------------------------------------------------------------------
// Shared-memory allreduce (Note [UCX shared-memory allreduce]).

absl::Status UcxCommunicator::InitSharedMemory(Store& store) {
  // Mailboxes for the header round when a header with a small payload is
  // small enough to keep two of per rank (the default 4 KiB is).
  const size_t header_bytes = sizeof(Header) + small_bytes_;
  const size_t mailbox_bytes = header_bytes <= kMaxMailboxBytes ? header_bytes : 0;
  const size_t bytes = ucx::ShmSegmentBytes(size_, options_.shm_chunk_bytes, mailbox_bytes);
  // Every rank says whether it could set up and map everything; the path is
  // used only if all could, so all ranks pick the same algorithm.
  std::string why;
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  std::string mine;
  void* local = nullptr;
  ucs_status_t st = ucp_mem_map(channel_.context(), &mp, &shm_memh_);
  if (st == UCS_OK) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    st = ucp_mem_query(shm_memh_, &attr);
    local = attr.address;
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  if (st == UCS_OK) st = ucp_rkey_pack(channel_.context(), shm_memh_, &packed, &packed_len);
  if (st == UCS_OK) {
    const uint64_t addr = reinterpret_cast<uintptr_t>(local);
    mine.assign(reinterpret_cast<const char*>(&addr), sizeof(addr));
    mine.append(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    ucx::InitShmSegment(static_cast<unsigned char*>(local), size_, options_.shm_chunk_bytes,
                        mailbox_bytes);
  } else {
    why = absl::StrCat("rank ", rank_, ": ", UcsError(st));
  }
  PrefixStore scoped(store_prefix_ + "/shm", store);
  auto all = StoreAllGather(scoped, "ucx/shm", rank_, size_, mine,
                            absl::Now() + options_.rendezvous_timeout);
  if (!all.ok()) return all.status();

  // Endpoints must be wired up before remote keys can be unpacked.
  if (absl::Status s = channel_.FlushEndpoints(absl::Now() + options_.rendezvous_timeout);
      !s.ok() && why.empty()) {
    why = std::string(s.message());
  }
  shm_group_ = ucx::ShmGroup{rank_, size_, options_.shm_chunk_bytes, {}, mailbox_bytes};
  shm_group_.bases.assign(size_, nullptr);
  shm_rkeys_.assign(size_, nullptr);
  shm_group_.bases[rank_] = static_cast<unsigned char*>(local);
  for (int peer = 0; peer < size_ && why.empty(); ++peer) {
    if (peer == rank_) continue;
    const std::string& blob = (*all)[peer];
    if (blob.size() <= sizeof(uint64_t)) {
      why = absl::StrCat("rank ", peer, " has no shared segment");
      break;
    }
    uint64_t raddr;
    std::memcpy(&raddr, blob.data(), sizeof(raddr));
    st =
        ucp_ep_rkey_unpack(channel_.endpoint(peer), blob.data() + sizeof(raddr), &shm_rkeys_[peer]);
    void* ptr = nullptr;
    if (st == UCS_OK) st = ucp_rkey_ptr(shm_rkeys_[peer], raddr, &ptr);
    if (st != UCS_OK) {
      why = absl::StrCat("rank ", rank_, " cannot map rank ", peer, "'s segment: ", UcsError(st));
      break;
    }
    shm_group_.bases[peer] = static_cast<unsigned char*>(ptr);
  }
  // "ok" names the segment's layout: ranks whose options or builds differ
  // would read each other's segments at other offsets, so they all fall
  // back instead.
  const std::string ok = absl::StrCat("ok ", options_.shm_chunk_bytes, " ", mailbox_bytes,
                                      " layout ", ucx::kShmLayoutVersion);
  PrefixStore scoped_ok(store_prefix_ + "/shm-ok", store);
  auto verdicts = StoreAllGather(scoped_ok, "ucx/shm-ok", rank_, size_, why.empty() ? ok : why,
                                 absl::Now() + options_.rendezvous_timeout);
  if (!verdicts.ok()) return verdicts.status();
  shm_enabled_ = std::all_of(verdicts->begin(), verdicts->end(),
                             [&](const std::string& v) { return v == (*verdicts)[0]; }) &&
                 absl::StartsWith((*verdicts)[0], "ok ");
  shm_exchange_ = shm_enabled_ && mailbox_bytes > 0;
  // Note [Faulting the segments in]: every segment is now known to be this
  // size.
  if (shm_enabled_ && ucx::FaultInGroup(size_, bytes)) {
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) ucx::FaultInShmSegment(shm_group_.bases[peer], bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status UcxCommunicator::ShmAllReduce(const Request& req, const Begun* begun) {
  const Header& h = req.header;
  const auto type = static_cast<DataType>(h.type);
  const size_t bytes = h.count * DataTypeSize(type);
  const bool choose = options_.shm_stores == UcxOptions::ShmStores::kAuto;
  // A begun call keeps the kind of store its first round was staged with,
  // and is charged that staging's time.
  const bool stream = begun != nullptr ? begun->stream : StreamsInto(bytes);
  shm_group_.stream_bytes = stream ? ucx::kStreamMinCopyBytes : 0;
  const auto start = std::chrono::steady_clock::now();
  absl::Duration waited;
  absl::Status s = ucx::ShmAllReduce(
      shm_group_, req.send, req.recv, h.count, type, static_cast<ReduceOp>(h.op), &shm_round_,
      core_.aborted(), channel_.deadline(), &waited, begun != nullptr && begun->staged);
  if (choose && s.ok()) {
    const absl::Duration before = begun != nullptr ? begun->staging : absl::ZeroDuration();
    staging_.Record(bytes, stream,
                    before + absl::FromChrono(std::chrono::steady_clock::now() - start) - waited);
  }
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    const UcxOptions& options, int rank, int size, Store& store) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rank ", rank, " for world size ", size));
  }
  if (options.chunk_bytes < 64 || options.chunk_bytes > (1u << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX chunk_bytes must be in [64, 1 GiB], got ", options.chunk_bytes));
  }
  if (options.shm_chunk_bytes < 64 || options.shm_chunk_bytes > (64u << 20) ||
      options.shm_chunk_bytes % 64 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX shm_chunk_bytes must be a multiple of 64 in [64, 64 MiB], got ",
        options.shm_chunk_bytes));
  }
  if (options.small_message_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX small_message_bytes must be at most 64 MiB, got ", options.small_message_bytes));
  }
  // Rank 0 of the linear round stages a message from every rank.
  constexpr size_t kLinearStagingLimit = size_t{256} << 20;
  if (options.linear_bytes > (1u << 20) ||
      (size > 1 && options.linear_bytes > kLinearStagingLimit / static_cast<size_t>(size - 1))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX linear_bytes must be at most 1 MiB and, times the ranks but one, at most 256 MiB "
        "(rank 0 of the linear round stages a message from every rank); got ",
        options.linear_bytes, " with ", size, " ranks"));
  }
  // The measured classes reach up to this much (Note [Measured choice]);
  // what the rounds carry stays within carried_bytes and, for the linear
  // round, kMeasuredLinearMaxBytes.
  if (options.measured_choice_bytes > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX measured_choice_bytes must be at most 1 MiB, got ", options.measured_choice_bytes));
  }
  if (options.recursive_doubling_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX recursive_doubling_bytes must be at most 64 MiB, got ",
                     options.recursive_doubling_bytes));
  }
  if (options.rabenseifner_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UCX rabenseifner_bytes must be at most 64 MiB, got ", options.rabenseifner_bytes));
  }
  if (absl::Status s = ValidateCollectiveTimeout("UCX", options.timeout); !s.ok()) return s;
  if (size > ucx::kMaxWorld) {
    return absl::InvalidArgumentError(
        absl::StrCat("the UCX communicator supports at most ", ucx::kMaxWorld,
                     " ranks (its ring's step numbers must fit its tags), got ", size));
  }
  auto comm = std::make_unique<UcxCommunicator>(options, rank, size, store);
  if (absl::Status s = comm->Init(store); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace fusebox::comm
