// MPI backend. See comm/mpi/communicator.h for the contract.
//
// Note [MPI progress thread]
// Every communicator owns two duplicates of MPI_COMM_WORLD and the shared
// core's progress thread (comm/async_core.h), which makes every MPI call on
// them (callers never execute: callers_execute is off). Callers only go
// through the core's checks, sequence number and queue; on the thread
//   1. Start issues the descriptor check of each queued call on check_comm_
//      (Note [Descriptor check]) as soon as the core hands it over, and
//      leaves it in flight;
//   2. Poll tests all outstanding requests with MPI_Testsome, finishes avg
//      (one division of the sum) on completion, and issues the data
//      collective (MPI_Iallreduce / MPI_Ibcast / MPI_Iallgather) on
//      data_comm_ once that Op's check has passed and every earlier Op has
//      passed or failed its own check, so data collectives are issued in
//      sequence order on every rank;
//   3. the core completes the Works strictly in sequence order, times out
//      the oldest, yields between polls while anything is in flight (ranks
//      are often oversubscribed), looks for new work for kIdleSpin when
//      idle, then sleeps.
// While anything is in flight the thread polls without sleeping, as MPI's
// own blocking calls do: one core per communicator with outstanding work.
// MPI must provide MPI_THREAD_MULTIPLE (InitMpi asks for it) when several
// communicators exist at once or the application calls MPI while one does;
// under MPI_THREAD_SERIALIZED only a single communicator and no concurrent
// MPI calls are safe. MPI must not be finalised while a communicator lives.
// Several Ops may be in flight at once in both phases. Because checks and
// data collectives live on separate communicators, each communicator sees
// its collectives in the same order on every rank, whatever the timing.
//
// Note [Descriptor check]
// Each Op is described by five int64 {kind, count, type, op, root} (-1 where
// a field does not apply). One MPI_Iallreduce of a 12-int64 record
// {min descriptor, its rank, max descriptor, its rank} with a user-defined
// commutative operator (lexicographic min and max) tells every rank whether
// all descriptors agree and, when they do not, which two ranks differ and
// how. All ranks see the same result, so either all issue the data
// collective or none does: a mismatch is an InvalidArgument on every rank,
// never a hang. Barrier is the check alone (an allreduce cannot complete on
// any rank before every rank has joined it), saving a round trip.
#include "comm/mpi/communicator.h"

// Only the C API: OpenMPI's deprecated C++ bindings need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "comm/async_core.h"
#include "comm/communicator.h"
#include "comm/fault.h"
#include "comm/reduce.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUSEBOX_HAS_LSAN 1
#endif
#endif
#if !defined(FUSEBOX_HAS_LSAN) && defined(__SANITIZE_ADDRESS__)
#define FUSEBOX_HAS_LSAN 1
#endif
#if FUSEBOX_HAS_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace fusebox::comm {
namespace {

// Whether InitMpi (rather than the application) initialised MPI, so that
// FinalizeMpi finalises only what InitMpi started. It mirrors MPI's own
// process-wide initialisation state, which is process-wide by nature.
std::atomic<bool>& InitializedByFusebox() {
  static std::atomic<bool> flag{false};
  return flag;
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

std::string MpiErrorString(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) {
    return absl::StrCat("MPI error code ", code);
  }
  return std::string(buf, static_cast<size_t>(len));
}

absl::Status MpiError(absl::string_view what, int code) {
  return absl::InternalError(
      absl::StrCat(what, " failed: ", MpiErrorString(code)));
}

// Owns one MPI handle (communicator, operator, datatype); frees it unless
// MPI is already finalised (freeing then would be erroneous, and the
// handle is gone with MPI anyway). Move-only.
template <typename Traits>
class MpiHandle {
 public:
  using Handle = typename Traits::Handle;
  MpiHandle() = default;
  ~MpiHandle() { Reset(); }
  MpiHandle(MpiHandle&& other) noexcept
      : h_(std::exchange(other.h_, Traits::Null())) {}
  MpiHandle& operator=(MpiHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      h_ = std::exchange(other.h_, Traits::Null());
    }
    return *this;
  }
  MpiHandle(const MpiHandle&) = delete;
  MpiHandle& operator=(const MpiHandle&) = delete;

  Handle get() const { return h_; }
  // For MPI calls that update a handle in place (MPI_Type_commit).
  Handle* mutable_get() { return &h_; }
  // For MPI's creation functions: frees any current handle first.
  Handle* out() {
    Reset();
    return &h_;
  }

 private:
  void Reset() {
    if (h_ != Traits::Null() && !MpiFinalized()) Traits::Free(&h_);
    h_ = Traits::Null();
  }
  Handle h_ = Traits::Null();
};

struct CommTraits {
  using Handle = MPI_Comm;
  static MPI_Comm Null() { return MPI_COMM_NULL; }
  static void Free(MPI_Comm* c) { MPI_Comm_free(c); }
};
struct OpTraits {
  using Handle = MPI_Op;
  static MPI_Op Null() { return MPI_OP_NULL; }
  static void Free(MPI_Op* op) { MPI_Op_free(op); }
};
struct TypeTraits {
  using Handle = MPI_Datatype;
  static MPI_Datatype Null() { return MPI_DATATYPE_NULL; }
  static void Free(MPI_Datatype* t) { MPI_Type_free(t); }
};
using MpiComm = MpiHandle<CommTraits>;
using MpiOp = MpiHandle<OpTraits>;
using MpiType = MpiHandle<TypeTraits>;

// ---- Element types and operators ------------------------------------------

// The MPI datatype that moves `t` unchanged. Half and bfloat16 travel as
// MPI_UINT16_T and are reduced by the user-defined operators below.
MPI_Datatype WireType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kFloat16: return MPI_UINT16_T;
    case DataType::kBFloat16: return MPI_UINT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kUInt8: return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

bool IsHalfWidthFloat(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBFloat16;
}

// Avg travels as Sum; FinishAvg divides once at the end.
ReduceOp WireOp(ReduceOp op) { return op == ReduceOp::kAvg ? ReduceOp::kSum : op; }

MPI_Op PredefinedOp(ReduceOp op) {
  switch (WireOp(op)) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kAvg: break;
  }
  return MPI_OP_NULL;
}

// MPI user function: inout[i] = in[i] (kOp) inout[i] for 16-bit float types,
// computed in float and rounded once per step (comm/reduce.h).
template <DataType kType, ReduceOp kOp>
void HalfWidthReduce(void* in, void* inout, int* len, MPI_Datatype* /*dt*/) {
  Reduce(in, inout, inout, static_cast<size_t>(*len), kType, kOp);
}

// Index of the user operator for (half or bfloat16, op) in the table.
constexpr int kNumWireOps = 4;  // sum, prod, min, max
int HalfOpIndex(DataType t, ReduceOp op) {
  int base = t == DataType::kBFloat16 ? kNumWireOps : 0;
  switch (WireOp(op)) {
    case ReduceOp::kSum: return base + 0;
    case ReduceOp::kProd: return base + 1;
    case ReduceOp::kMin: return base + 2;
    case ReduceOp::kMax: return base + 3;
    case ReduceOp::kAvg: break;
  }
  return base;
}

// ---- Descriptor check (Note [Descriptor check]) ---------------------------

enum class OpKind : int64_t { kAllReduce = 0, kBroadcast = 1, kAllGather = 2, kBarrier = 3 };

constexpr int kDescFields = 5;                  // kind, count, type, op, root
constexpr int kCheckHalf = kDescFields + 1;     // descriptor + rank
constexpr int kCheckInts = 2 * kCheckHalf;      // {min half, max half}
using CheckRecord = std::array<int64_t, kCheckInts>;

bool LexLess(const int64_t* a, const int64_t* b, int n) {
  for (int i = 0; i < n; ++i) {
    if (a[i] != b[i]) return a[i] < b[i];
  }
  return false;
}

// MPI user function over records of kCheckInts int64: keeps the smaller
// (descriptor, rank) in the first half and the larger in the second.
// Commutative and associative (min and max of a total order).
void CheckReduce(void* in, void* inout, int* len, MPI_Datatype* /*dt*/) {
  const auto* a = static_cast<const int64_t*>(in);
  auto* b = static_cast<int64_t*>(inout);
  for (int n = 0; n < *len; ++n, a += kCheckInts, b += kCheckInts) {
    if (LexLess(a, b, kCheckHalf)) {
      std::copy(a, a + kCheckHalf, b);
    }
    if (LexLess(b + kCheckHalf, a + kCheckHalf, kCheckHalf)) {
      std::copy(a + kCheckHalf, a + kCheckInts, b + kCheckHalf);
    }
  }
}

absl::string_view KindName(int64_t kind) {
  switch (kind) {
    case static_cast<int64_t>(OpKind::kAllReduce): return "AllReduce";
    case static_cast<int64_t>(OpKind::kBroadcast): return "Broadcast";
    case static_cast<int64_t>(OpKind::kAllGather): return "AllGather";
    case static_cast<int64_t>(OpKind::kBarrier): return "Barrier";
  }
  return "unknown collective";
}

// "count=100 float sum", "count=7 int32 root=2", "" (barrier). Descriptors
// come from peers: out-of-range codes are printed, never indexed.
std::string DescribeFields(const int64_t* d) {
  if (d[0] == static_cast<int64_t>(OpKind::kBarrier)) return "";
  std::string out = absl::StrCat("count=", d[1], " ");
  if (d[2] >= 0 && d[2] < kNumDataTypes) {
    absl::StrAppend(&out, DataTypeName(static_cast<DataType>(d[2])));
  } else {
    absl::StrAppend(&out, "type#", d[2]);
  }
  if (d[3] >= 0) {
    if (d[3] < kNumReduceOps) {
      absl::StrAppend(&out, " ", ReduceOpName(static_cast<ReduceOp>(d[3])));
    } else {
      absl::StrAppend(&out, " op#", d[3]);
    }
  }
  if (d[4] >= 0) absl::StrAppend(&out, " root=", d[4]);
  return out;
}

// OK when the reduced record shows one descriptor on all ranks; otherwise
// the InvalidArgument every rank reports, e.g. "AllReduce mismatch at
// collective #3: rank 0 has count=100 float sum, rank 1 has count=200 float
// sum".
absl::Status CheckResult(const CheckRecord& r, uint64_t seq) {
  const int64_t* lo = r.data();
  const int64_t* hi = r.data() + kCheckHalf;
  if (!LexLess(lo, hi, kDescFields)) return absl::OkStatus();
  std::string lo_text, hi_text, head;
  if (lo[0] == hi[0]) {
    head = absl::StrCat(KindName(lo[0]), " mismatch");
    lo_text = DescribeFields(lo);
    hi_text = DescribeFields(hi);
  } else {
    head = "collective mismatch";
    lo_text = absl::StrCat(KindName(lo[0]), " ", DescribeFields(lo));
    hi_text = absl::StrCat(KindName(hi[0]), " ", DescribeFields(hi));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      head, " at collective #", seq, ": rank ", lo[kDescFields], " has ",
      lo_text, ", rank ", hi[kDescFields], " has ", hi_text,
      " (every rank must issue the same collectives in the same order)"));
}

// ---- The communicator -------------------------------------------------------

// How long an idle progress thread keeps looking for work before sleeping.
constexpr absl::Duration kIdleSpin = absl::Microseconds(50);

// The queue, the progress thread, sequence numbers, sticky failure and
// deadlines are the shared core's (comm/async_core.h); this class issues
// each collective's check and data collective and polls them (several in
// flight at once).
class MpiCommunicator final : public Communicator, private CollectiveExecutor {
 public:
  // Collective over MPI_COMM_WORLD (duplicates it twice). `store` (may be
  // null) serves the post-mortem of a timeout.
  static absl::StatusOr<std::unique_ptr<MpiCommunicator>> Create(const MpiOptions& options,
                                                                 Store* store);

  // Waits for every queued and in-flight collective to finish (their
  // buffers are in use until then: the core's kDrain), joins the progress
  // thread, then frees the communicators and operators.
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

 protected:
  // Note [One front door]: every call goes into the core.
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& a) override {
    return core_.Issue(a);
  }

 private:
  enum class Phase {
    kQueued,    // created, its check not yet issued (only inside Start)
    kChecking,  // descriptor check in flight
    kChecked,   // check finished, data collective not yet issued
    kRunning,   // data collective in flight
    kFinished,  // status final; reported to the core by Poll
  };

  struct Op {
    uint64_t seq = 0;
    OpKind kind = OpKind::kBarrier;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    DataType type = DataType::kFloat32;
    ReduceOp op = ReduceOp::kSum;
    int root = -1;
    Phase phase = Phase::kQueued;
    CheckRecord check{};
    MPI_Request request = MPI_REQUEST_NULL;
    absl::Status status;
  };

  MpiCommunicator(const MpiOptions& options, Store* store, int rank, int size,
                  MpiComm data_comm, MpiComm check_comm, MpiType check_type, MpiOp check_op,
                  std::array<MpiOp, 2 * kNumWireOps> half_ops);

  static AsyncCoreOptions CoreOptions(const MpiOptions& o, int rank, int size) {
    AsyncCoreOptions c;
    c.backend = "MPI";
    c.rank = rank;
    c.size = size;
    c.timeout = o.timeout;
    c.idle_spin = kIdleSpin;
    // Only the progress thread calls MPI (Note [MPI progress thread]).
    c.callers_execute = false;
    c.on_stop = AsyncCoreOptions::OnStop::kDrain;
    return c;
  }

  // CollectiveExecutor (Note [MPI progress thread]).
  absl::Status CheckLimits(const CollectiveCall& call) const override;
  // Issues the call's descriptor check; it stays in flight.
  StartOutcome Start(CollectiveCall& call) override;
  // Polls the checks and data collectives in flight, issues data
  // collectives in sequence order, reports the Ops that finished.
  absl::Status Poll(std::vector<FinishedCall>* finished) override;
  // The error of an Op that has been the oldest for longer than
  // options_.timeout, with the post-mortem when a store is at hand (Note
  // [Timeout post-mortem]).
  absl::Status TimedOut(const CollectiveCall& oldest) override;
  // Keeps the Ops whose MPI requests are outstanding (abandoned_).
  void AbandonInFlight() override;

  absl::Status IssueCheck(Op& op);
  // Issues the data collective, or finishes `op` if it has none.
  absl::Status IssueData(Op& op);

  const MpiOptions options_;
  Store* const store_;       // may be null
  std::string store_scope_;  // keys of this communicator's post-mortem
  const int rank_;
  const int size_;
  MpiComm data_comm_;
  MpiComm check_comm_;
  MpiType check_type_;
  MpiOp check_op_;
  std::array<MpiOp, 2 * kNumWireOps> half_ops_;

  // Executor state (the core's progress thread): the Ops in flight, in
  // sequence order.
  std::deque<std::unique_ptr<Op>> active_;
  std::vector<MPI_Request> poll_requests_;
  std::vector<Op*> poll_owners_;
  std::vector<int> poll_indices_;

  // Ops whose MPI requests were abandoned after a fatal error (progress
  // thread until it is joined). MPI cannot cancel a collective, so their
  // memory is never freed: the destructor leaks it on purpose.
  std::vector<std::unique_ptr<Op>> abandoned_;

  // Issue, queue, progress thread, sticky failure, deadlines (Note
  // [Asynchronous core]); started last, stopped first.
  AsyncCore core_;
};

absl::StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(
    const MpiOptions& options, Store* store) {
  if (absl::Status s = ValidateCollectiveTimeout("MPI", options.timeout); !s.ok()) return s;
  if (!MpiIsInitialized()) {
    return absl::FailedPreconditionError(
        "the MPI backend needs MPI to be initialised (call InitMpi first) and "
        "not yet finalised");
  }
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(
        "the MPI backend needs MPI_THREAD_SERIALIZED or better (its progress "
        "thread makes the MPI calls); MPI was initialised with a lower level");
  }
  MpiComm data_comm, check_comm;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, data_comm.out());
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
  rc = MPI_Comm_dup(MPI_COMM_WORLD, check_comm.out());
  if (rc != MPI_SUCCESS) return MpiError("MPI_Comm_dup", rc);
  // Errors on our communicators are reported to us, not fatal.
  MPI_Comm_set_errhandler(data_comm.get(), MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(check_comm.get(), MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(data_comm.get(), &rank);
  MPI_Comm_size(data_comm.get(), &size);

  MpiType check_type;
  rc = MPI_Type_contiguous(kCheckInts, MPI_INT64_T, check_type.out());
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(check_type.mutable_get());
  if (rc != MPI_SUCCESS) return MpiError("MPI_Type_contiguous/commit", rc);
  MpiOp check_op;
  rc = MPI_Op_create(&CheckReduce, /*commute=*/1, check_op.out());
  if (rc != MPI_SUCCESS) return MpiError("MPI_Op_create", rc);

  using Fn = MPI_User_function*;
  const std::array<Fn, 2 * kNumWireOps> fns = {
      &HalfWidthReduce<DataType::kFloat16, ReduceOp::kSum>,
      &HalfWidthReduce<DataType::kFloat16, ReduceOp::kProd>,
      &HalfWidthReduce<DataType::kFloat16, ReduceOp::kMin>,
      &HalfWidthReduce<DataType::kFloat16, ReduceOp::kMax>,
      &HalfWidthReduce<DataType::kBFloat16, ReduceOp::kSum>,
      &HalfWidthReduce<DataType::kBFloat16, ReduceOp::kProd>,
      &HalfWidthReduce<DataType::kBFloat16, ReduceOp::kMin>,
      &HalfWidthReduce<DataType::kBFloat16, ReduceOp::kMax>,
  };
  std::array<MpiOp, 2 * kNumWireOps> half_ops;
  for (size_t i = 0; i < fns.size(); ++i) {
    rc = MPI_Op_create(fns[i], /*commute=*/1, half_ops[i].out());
    if (rc != MPI_SUCCESS) return MpiError("MPI_Op_create", rc);
  }
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(
      options, store, rank, size, std::move(data_comm), std::move(check_comm),
      std::move(check_type), std::move(check_op), std::move(half_ops)));
  if (store != nullptr) {
    // Every rank creates its communicators in the same order, so the n-th
    // one has the same scope everywhere.
    auto instance = store->Add(absl::StrCat("mpi/instances/", rank), 1);
    if (!instance.ok()) return instance.status();
    c->store_scope_ = absl::StrCat("mpi/", *instance);
  }
  c->core_.Start(c.get());
  return c;
}

MpiCommunicator::MpiCommunicator(const MpiOptions& options, Store* store, int rank, int size,
                                 MpiComm data_comm, MpiComm check_comm, MpiType check_type,
                                 MpiOp check_op, std::array<MpiOp, 2 * kNumWireOps> half_ops)
    : options_(options),
      store_(store),
      rank_(rank),
      size_(size),
      data_comm_(std::move(data_comm)),
      check_comm_(std::move(check_comm)),
      check_type_(std::move(check_type)),
      check_op_(std::move(check_op)),
      half_ops_(std::move(half_ops)),
      core_(CoreOptions(options, rank, size)) {}

MpiCommunicator::~MpiCommunicator() {
  core_.Stop();  // drains: every collective finishes (or the communicator fails) first
  for (std::unique_ptr<Op>& op : abandoned_) {
    Op* leaked = op.release();
#if FUSEBOX_HAS_LSAN
    __lsan_ignore_object(leaked);
#else
    (void)leaked;
#endif
  }
}

// Counts beyond INT_MAX would need splitting (MPI counts are int); callers
// (the bucketing engine) use far smaller buckets, so they are rejected.
absl::Status MpiCommunicator::CheckLimits(const CollectiveCall& call) const {
  if (call.count > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        CollectiveKindName(call.kind), ": count ", call.count,
        " exceeds the MPI backend's limit of ", INT_MAX, " elements per call; split the buffer"));
  }
  return absl::OkStatus();
}

OpKind ToOpKind(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return OpKind::kAllReduce;
    case CollectiveKind::kBroadcast: return OpKind::kBroadcast;
    case CollectiveKind::kAllGather: return OpKind::kAllGather;
    case CollectiveKind::kBarrier: return OpKind::kBarrier;
  }
  return OpKind::kBarrier;
}

StartOutcome MpiCommunicator::Start(CollectiveCall& call) {
  auto op = std::make_unique<Op>();
  op->seq = call.seq;
  op->kind = ToOpKind(call.kind);
  op->send = call.send;
  op->recv = call.recv;
  op->count = call.count;
  op->type = call.type;
  op->op = call.op;
  op->root = call.kind == CollectiveKind::kBroadcast ? call.root : -1;
  StartOutcome o;
  if (absl::Status s = IssueCheck(*op); !s.ok()) {
    o.status = std::move(s);
    o.fatal = true;
    return o;
  }
  op->phase = Phase::kChecking;
  active_.push_back(std::move(op));
  o.in_flight = true;
  return o;
}

absl::Status MpiCommunicator::Poll(std::vector<FinishedCall>* finished) {
  // 1. Poll everything in flight.
  std::vector<MPI_Request>& requests = poll_requests_;
  std::vector<Op*>& owners = poll_owners_;
  std::vector<int>& indices = poll_indices_;
  requests.clear();
  owners.clear();
  for (auto& op : active_) {
    if (op->request != MPI_REQUEST_NULL) {
      requests.push_back(op->request);
      owners.push_back(op.get());
    }
  }
  if (!requests.empty()) {
    indices.resize(requests.size());
    int done = 0;
    const int rc = MPI_Testsome(static_cast<int>(requests.size()),
                                requests.data(), &done, indices.data(),
                                MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Testsome", rc);
    if (done == MPI_UNDEFINED) done = 0;
    for (int i = 0; i < done; ++i) {
      Op& op = *owners[static_cast<size_t>(indices[static_cast<size_t>(i)])];
      op.request = MPI_REQUEST_NULL;
      if (op.phase == Phase::kChecking) {
        op.phase = Phase::kChecked;
      } else if (op.phase == Phase::kRunning) {
        if (op.op == ReduceOp::kAvg && op.kind == OpKind::kAllReduce) {
          FinishAvg(op.recv, op.count, op.type, size_);
        }
        op.phase = Phase::kFinished;
      }
    }
  }

  // 2. Issue data collectives in sequence order: an Op whose check is still
  //    in flight holds back every later one.
  for (auto& op : active_) {
    if (op->phase == Phase::kQueued || op->phase == Phase::kChecking) break;
    if (op->phase != Phase::kChecked) continue;
    op->status = CheckResult(op->check, op->seq);
    if (!op->status.ok()) {
      op->phase = Phase::kFinished;  // a mismatch: this call fails, on every rank
      continue;
    }
    if (absl::Status s = IssueData(*op); !s.ok()) return s;
  }

  // 3. Report what finished (the core completes Works in sequence order).
  for (auto it = active_.begin(); it != active_.end();) {
    if ((*it)->phase != Phase::kFinished) {
      ++it;
      continue;
    }
    finished->push_back(FinishedCall{(*it)->seq, std::move((*it)->status)});
    it = active_.erase(it);
  }
  return absl::OkStatus();
}

absl::Status MpiCommunicator::IssueCheck(Op& op) {
  const int64_t desc[kDescFields] = {
      static_cast<int64_t>(op.kind),
      op.kind == OpKind::kBarrier ? 0 : static_cast<int64_t>(op.count),
      op.kind == OpKind::kBarrier ? -1 : static_cast<int64_t>(op.type),
      op.kind == OpKind::kAllReduce ? static_cast<int64_t>(op.op) : -1,
      op.kind == OpKind::kBroadcast ? op.root : -1,
  };
  std::copy(desc, desc + kDescFields, op.check.begin());
  op.check[kDescFields] = rank_;
  std::copy(op.check.begin(), op.check.begin() + kCheckHalf,
            op.check.begin() + kCheckHalf);
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, op.check.data(), 1,
                                check_type_.get(), check_op_.get(),
                                check_comm_.get(), &op.request);
  if (rc != MPI_SUCCESS) return MpiError("MPI_Iallreduce (descriptor check)", rc);
  return absl::OkStatus();
}

absl::Status MpiCommunicator::IssueData(Op& op) {
  if (op.kind == OpKind::kBarrier || op.count == 0) {
    op.phase = Phase::kFinished;  // nothing to move
    return absl::OkStatus();
  }
  const int count = static_cast<int>(op.count);  // checked <= INT_MAX
  const MPI_Datatype dt = WireType(op.type);
  int rc = MPI_SUCCESS;
  switch (op.kind) {
    case OpKind::kAllReduce: {
      const MPI_Op mop = IsHalfWidthFloat(op.type)
                             ? half_ops_[static_cast<size_t>(HalfOpIndex(op.type, op.op))].get()
                             : PredefinedOp(op.op);
      const void* send = op.send == op.recv ? MPI_IN_PLACE : op.send;
      rc = MPI_Iallreduce(send, op.recv, count, dt, mop, data_comm_.get(),
                          &op.request);
      break;
    }
    case OpKind::kBroadcast:
      rc = MPI_Ibcast(op.recv, count, dt, op.root, data_comm_.get(),
                      &op.request);
      break;
    case OpKind::kAllGather: {
      const auto* mine = static_cast<const char*>(op.recv) +
                         static_cast<size_t>(rank_) * op.count * DataTypeSize(op.type);
      const void* send = op.send == mine ? MPI_IN_PLACE : op.send;
      rc = MPI_Iallgather(send, count, dt, op.recv, count, dt,
                          data_comm_.get(), &op.request);
      break;
    }
    case OpKind::kBarrier:
      break;
  }
  if (rc != MPI_SUCCESS) {
    return MpiError(absl::StrCat("issuing ", KindName(static_cast<int64_t>(op.kind))), rc);
  }
  op.phase = Phase::kRunning;
  return absl::OkStatus();
}

void MpiCommunicator::AbandonInFlight() {
  // Requests still in flight are abandoned, not freed: MPI may still be
  // writing their buffers (and check records), and the communicator is not
  // used again.
  for (auto& op : active_) {
    if (op->request != MPI_REQUEST_NULL) abandoned_.push_back(std::move(op));
  }
  active_.clear();
}

absl::Status MpiCommunicator::TimedOut(const CollectiveCall& oldest) {
  const Op* found = nullptr;
  for (const auto& a : active_) {
    if (a->seq == oldest.seq) found = a.get();
  }
  if (found == nullptr) {
    return absl::InternalError(
        absl::StrCat("MPI collective #", oldest.seq, " timed out but is not in flight"));
  }
  const Op& op = *found;
  std::string what = absl::StrCat(KindName(static_cast<int64_t>(op.kind)), " #", op.seq);
  const std::string fields = DescribeFields(op.check.data());
  if (!fields.empty()) absl::StrAppend(&what, " (", fields, ")");
  absl::StrAppend(&what, op.phase == Phase::kChecking
                             ? " waiting in its descriptor check for a rank that has not joined it"
                             : " waiting in MPI for a rank that has not joined it");
  std::string post_mortem = "no store to ask the other ranks (launched without one)";
  if (store_ != nullptr) {
    post_mortem =
        TimeoutPostMortem(*store_, store_scope_, rank_, size_, what,
                          PostMortemGrace(options_.timeout), PostMortemStay(options_.timeout));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", rank_, ": MPI ", what, " (timed out after ", absl::FormatDuration(options_.timeout),
      "); ", post_mortem));
}

}  // namespace

absl::Status InitMpi(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (MpiFinalized()) {
    return absl::FailedPreconditionError("MPI has already been finalised");
  }
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // MULTIPLE lets several communicators (each with its own progress
    // thread) and the application use MPI at once.
    const int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return MpiError("MPI_Init_thread", rc);
    InitializedByFusebox().store(true);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MPI provides thread level ", provided,
        "; fusebox needs MPI_THREAD_SERIALIZED or better"));
  }
  return absl::OkStatus();
}

void FinalizeMpi() {
  if (InitializedByFusebox().exchange(false) && MpiIsInitialized()) {
    MPI_Finalize();
  }
}

bool MpiIsInitialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0 && !MpiFinalized();
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateMpiCommunicator(
    const MpiOptions& options, Store* store) {
  auto c = MpiCommunicator::Create(options, store);
  if (!c.ok()) return c.status();
  return std::unique_ptr<Communicator>(*std::move(c));
}

}  // namespace fusebox::comm
