// UCX backend. See communicator.h for the contract.
//
// The protocol: Note [UCX collective protocol] in communicator.h.
#include "comm/ucx/communicator.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "comm/async_core.h"
#include "comm/fault.h"
#include "comm/ucx/algo/context.h"
#include "comm/ucx/algo/registry.h"
#include "comm/ucx/algo/shm_allreduce.h"
#include "comm/ucx/algorithms.h"
#include "comm/ucx/choice.h"
#include "comm/ucx/channel.h"
#include "comm/ucx/descriptor_round.h"
#include "comm/ucx/header.h"
#include "comm/ucx/header_round.h"
#include "comm/ucx/options.h"
#include "comm/ucx/shm_setup.h"
#include "comm/ucx/wire_up.h"

namespace fusebox::comm {
namespace {

using ucx::Algorithm;
using ucx::Begun;
using ucx::Describe;
using ucx::Header;
using ucx::kHeaderMagic;
using ucx::Kind;
using ucx::Request;

// Note [Beginning on the issuing thread] in communicator.h.

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
  // The table, the measured choices made so far (Note [Measured choice]),
  // and whether large allreduces read their peers in place (Note
  // [Single-copy allreduce]).
  std::string Algorithms() const override {
    if (!segments_.enabled) return choice_.Describe();
    return absl::StrCat(
        choice_.Describe(), "\nSingle copy: ",
        shm_.group.pids.empty()
            ? absl::StrCat("off (", segments_.cma_verdict, ")")
            : absl::StrCat("on, shm-allreduce of ", shm_.group.cma_min_bytes, " to ",
                           shm_.group.cma_max_bytes,
                           " bytes reads the peers' buffers by cross-memory attach"));
  }
  std::vector<std::string> SetupNotes() const override {
    if (core_.progress_priority().ok()) return {};
    return {std::string(core_.progress_priority().message())};
  }
  MemoryKind memory() const override { return MemoryKind::kHost; }

 protected:
  // Note [One front door]: every call goes into the core.
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& a) override {
    return core_.Issue(a);
  }
  // Note [Blocking calls]: on the calling thread when nothing is ahead.
  absl::Status DoRun(const CollectiveArgs& a) override {
    return core_.Run(a);
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
    c.waiter_window = o.waiter_window;
    c.on_stop = AsyncCoreOptions::OnStop::kCancel;
    return c;
  }
  // After the channel is connected: how this rank waits, the shared-memory
  // segments, the table, the staging; then starts the core.
  absl::Status SetUp(Store& store, const ucx::Peers& peers, unsigned cores);
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
  // Over messages: the opening round (carrying the collective where `unit`
  // is carried in it) and rank 0's announcement; *done where the round was
  // the whole collective.
  absl::Status OpenOverMessages(ucx::Context& ctx, const ucx::AlgorithmUnit& unit,
                                const Request& req, bool* done);
  ucx::Context MakeContext(const Begun* begun);

  const UcxOptions options_;
  const int rank_;
  const int size_;
  Store& store_;  // outlives the communicator; used again only by a post-mortem
  std::string store_prefix_;  // keys of this communicator's exchanges

  // Note [Algorithm table] with Note [Measured choice] over it; built in
  // Init, the same on every rank.
  ucx::AlgorithmChoice choice_;

  // What the algorithms run on (executing thread): the ring's staging, the
  // descriptor round's messages (Note [Descriptor round]: they grow to the
  // table's carried_bytes), the header round, the shared-memory state.
  std::vector<unsigned char> ring_slots_;
  ucx::DescriptorStaging descriptor_staging_;
  ucx::HeaderRound header_round_;
  ucx::ShmState shm_;
  // Shared-memory path (Note [UCX shared-memory allreduce]); its header
  // round through the segments' mailboxes (Note [Shared-memory exchange])
  // where every rank has them.
  ucx::ShmSegments segments_;
  // The call Begin began, until Start takes it (executor lock).
  std::optional<Begun> begun_;

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
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string mine = ucx::RendezvousRecord(options_, cores, *address);
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
  absl::StatusOr<ucx::Peers> peers = ucx::ParseRecords(*all);
  if (!peers.ok()) return peers.status();
  if (absl::Status s = channel_.Connect(peers->addresses, options_.detect_peer_failure); !s.ok()) {
    return s;
  }
  return SetUp(store, *peers, cores);
}

absl::Status UcxCommunicator::SetUp(Store& store, const ucx::Peers& peers, unsigned cores) {
  const bool oversubscribed = peers.OversubscribedAt(rank_);
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
  ucx::AlgorithmInputs inputs =
      ucx::TableInputs(options_, size_, cores, peers.AnyOversubscribed());
  // The shared-memory path cannot notice a dead peer; a user who asked for
  // peer-failure detection gets the (TCP) messaging path only.
  if (options_.use_shared_memory && !options_.detect_peer_failure && size_ > 1 &&
      options_.transports == UcxOptions{}.transports) {
    if (absl::Status s = ucx::SetUpSharedMemory(channel_, store, store_prefix_, options_,
                                                ucx::SmallMessageBytes(inputs), &shm_.group,
                                                &segments_);
        !s.ok()) {
      return s;
    }
  }
  inputs.shm_exchange = segments_.exchange;
  inputs.shm_allreduce = segments_.enabled;
  choice_.Init(inputs, rank_);
  // Oversubscribed, 4 ranks bound two to a core: 8 B allreduce 23-25 ->
  // 20-21 us, 128 KiB 65-90 -> 50-77 us.
  shm_.group.yield_mask = oversubscribed ? 0 : 255;
  shm_.stores = options_.shm_stores;
  shm_.aborted = &core_.aborted();
  header_round_.Init(size_, sizeof(Header) + choice_.table().small_bytes(), segments_.exchange,
                     &shm_.group, &core_.aborted());
  ring_slots_.resize(options_.chunk_bytes * ucx::kRingSlots);
  // Note [Beginning on the issuing thread]: kAuto where this rank's
  // machine has fewer cores than its ranks' callers and progress threads.
  const bool issuer_begins =
      segments_.exchange && (options_.issuer_begins == UcxOptions::IssuerBegins::kOn ||
                             (options_.issuer_begins == UcxOptions::IssuerBegins::kAuto &&
                              2 * peers.RanksAt(rank_) > peers.cores[rank_]));
  core_.Start(this, oversubscribed ? 0 : options_.progress_nice,
              oversubscribed ? absl::ZeroDuration() : options_.progress_slice, issuer_begins);
  return absl::OkStatus();
}

UcxCommunicator::~UcxCommunicator() {
  // In-flight and queued collectives end as Cancelled; the progress thread
  // is joined.
  core_.Stop();
  // Remote keys go before the endpoints they were unpacked on (ucp.h).
  segments_.DestroyKeys();
  // After a failure a peer may be dead or stuck: no flush that waits on it.
  // A mismatch leaves every peer alive and maybe still waiting for this
  // rank's last message (the descriptor round's hand-back): flush it.
  channel_.Close(/*force=*/peer_trouble_.load() || core_.cancelled_any());
  segments_.Unmap(channel_.context());
  // channel_'s destructor then destroys the worker and the context.
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
  if (!segments_.exchange || size_ < 2 || call.kind != Kind::kAllReduce || begun_.has_value() ||
      choice_.measuring()) {
    return false;
  }
  const Request req = MakeRequest(call);
  const Algorithm algorithm = choice_.table().Select(Kind::kAllReduce, req.bytes());
  if (algorithm != Algorithm::kOneShot && algorithm != Algorithm::kShmAllReduce) return false;
  const ucx::AlgorithmUnit& unit = ucx::UnitOf(algorithm);
  const ucx::HeaderPayload payload =
      unit.payload != nullptr ? unit.payload(req, rank_) : ucx::HeaderPayload{};
  // Where it does not fit a mailbox, Start says why.
  absl::StatusOr<uint64_t> exchange = header_round_.Publish(req, payload);
  if (!exchange.ok()) return false;
  Begun b;
  b.seq = call.seq;
  b.exchange = *exchange;
  if (algorithm == Algorithm::kShmAllReduce) ucx::BeginShmAllReduce(shm_, req, &b);
  begun_ = b;
  return true;
}

StartOutcome UcxCommunicator::Start(CollectiveCall& call) {
  Request req = MakeRequest(call);
  // Note [Measured choice]: rank 0's decisions ride in its header, in
  // every round over messages.
  if (!segments_.exchange && size_ > 1) req.header.pad = choice_.TakeAnnouncement();
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

ucx::Context UcxCommunicator::MakeContext(const Begun* begun) {
  ucx::Context ctx;
  ctx.channel = &channel_;
  ctx.chunk_bytes = options_.chunk_bytes;
  ctx.ring_slots = &ring_slots_;
  ctx.received = &header_round_.received();
  const ucx::AlgorithmTable& t = choice_.table();
  ctx.limits = {t.carried_bytes(), t.linear_bytes(), t.linear_watched()};
  ctx.descriptor_staging = &descriptor_staging_;
  ctx.shm = &shm_;
  ctx.begun = begun;
  return ctx;
}

absl::Status UcxCommunicator::OpenOverMessages(ucx::Context& ctx, const ucx::AlgorithmUnit& unit,
                                               const Request& req, bool* done) {
  // Note [Descriptor round]: instead of the header round, and carrying the
  // AllReduce the table (or the measured choice) gives it. The linear round
  // where it opens collectives (Note [Linear round]) or carries this
  // AllReduce; otherwise the descriptor round, with the linear round
  // watched beside it where the linear round opens or may carry a measured
  // class (Note [Watching the linear round]).
  *done = unit.open != nullptr;
  absl::Status s;
  if (unit.open != nullptr) {
    s = unit.open(ctx, req);
  } else if (choice_.table().linear()) {
    s = ucx::LinearRound(channel_, req.header, nullptr, ctx.limits.linear_bytes,
                         &descriptor_staging_);
  } else {
    s = ucx::DescriptorRound(channel_, req.header, nullptr, ctx.limits.carried_bytes,
                             &descriptor_staging_, ctx.limits.watch());
  }
  // A clean round ends with rank 0's header on every rank, and any
  // decision it announces applies from the next collective.
  if (s.ok() && descriptor_staging_.rank0_pad != 0) s = choice_.Apply(descriptor_staging_.rank0_pad);
  return s;
}

absl::Status UcxCommunicator::Run(const Request& req, const Begun* begun) {
  const ucx::AlgorithmChoice::Made made = choice_.Choose(req.kind(), req.bytes());
  const ucx::AlgorithmUnit& unit = ucx::UnitOf(made.algorithm);
  ucx::Context ctx = MakeContext(begun);
  if (!segments_.exchange && size_ > 1) {
    bool done = false;
    if (absl::Status s = OpenOverMessages(ctx, unit, req, &done); !s.ok()) return s;
    if (done) {
      choice_.Record(made);
      return absl::OkStatus();
    }
    // What follows the round is not measured, unless a measured class runs
    // the ring (or the shared-memory allreduce) after it: that call is timed
    // to its end below. Otherwise the next call is timed from its own start.
    if (!made.pick.has_value()) choice_.Record(made);
  } else {
    const ucx::HeaderPayload payload =
        unit.payload != nullptr ? unit.payload(req, rank_) : ucx::HeaderPayload{};
    if (absl::Status s = header_round_.Run(req, payload, begun, channel_.deadline()); !s.ok()) {
      return s;
    }
  }
  if (unit.run == nullptr) return absl::OkStatus();  // the opening round was all
  absl::Status s = unit.run(ctx, req);
  if (made.pick.has_value()) choice_.Record(made);
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateUcxCommunicator(
    const UcxOptions& options, int rank, int size, Store& store) {
  if (absl::Status s = ucx::ValidateUcxOptions(options, rank, size); !s.ok()) return s;
  auto comm = std::make_unique<UcxCommunicator>(options, rank, size, store);
  if (absl::Status s = comm->Init(store); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace fusebox::comm
