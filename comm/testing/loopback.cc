#include "comm/testing/loopback.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/reduce.h"
#include "comm/types.h"

namespace fusebox::comm::testing {
namespace {

using Kind = CollectiveKind;

// One rank's call of one collective: its arguments, and what the group
// adds.
struct Call : CollectiveArgs {
  uint64_t seq = 0;  // this rank's call number: the collective's identity
  absl::Time issued;
  std::shared_ptr<Work> work;
};

// As the UCX backend describes a call in its mismatch message.
std::string Describe(const Call& c) {
  std::string s = absl::StrCat(CollectiveKindName(c.kind), "(count=", c.count);
  if (c.kind != Kind::kBarrier) absl::StrAppend(&s, ", type=", DataTypeName(c.type));
  if (c.kind == Kind::kAllReduce) absl::StrAppend(&s, ", op=", ReduceOpName(c.op));
  if (c.kind == Kind::kBroadcast) absl::StrAppend(&s, ", root=", c.root);
  absl::StrAppend(&s, ", seq=", c.seq, ")");
  return s;
}

bool SameCall(const Call& a, const Call& b) {
  return a.kind == b.kind && a.count == b.count && a.type == b.type && a.op == b.op &&
         a.root == b.root;
}

// The collectives of one group: per-rank queues of calls, matched position
// by position and run by one executor thread (Note [Loopback semantics]).
class Group {
 public:
  Group(int world, const LoopbackOptions& options)
      : world_(world), options_(options), queues_(world), next_seq_(world, 0), left_(world, false) {
    thread_ = std::thread([this] { Run(); });
  }

  ~Group() {
    if (std::this_thread::get_id() == thread_.get_id()) {
      // Joining itself would hang; the header forbids this.
      std::fprintf(stderr, "fusebox loopback: the last communicator of a group was destroyed "
                           "from a completion callback\n");
      std::abort();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  int world() const { return world_; }

  absl::StatusOr<std::shared_ptr<Work>> Issue(int rank, Call call) {
    std::shared_ptr<Work> work = std::make_shared<Work>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return failed_;
      call.seq = next_seq_[rank]++;
      call.issued = absl::Now();
      call.work = work;
      queues_[rank].push_back(std::move(call));
    }
    cv_.notify_all();
    return work;
  }

  void Leave(int rank) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      left_[rank] = true;
      if (!queues_[rank].empty() && failed_.ok()) {
        failed_ = absl::AbortedError(absl::StrCat(
            "loopback: rank ", rank, "'s communicator was destroyed with ",
            queues_[rank].size(), " collective(s) pending"));
      }
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    const auto any_queued = [&] {
      return std::any_of(queues_.begin(), queues_.end(),
                         [](const std::deque<Call>& q) { return !q.empty(); });
    };
    for (;;) {
      if (stop_ || !failed_.ok()) {
        // Everything still queued fails with the group's status; a failed
        // group takes no new calls (Issue), so then only stop_ is left.
        const absl::Status doom =
            stop_ ? absl::AbortedError("loopback: the group was destroyed") : failed_;
        std::vector<Call> doomed;
        for (std::deque<Call>& q : queues_) {
          for (Call& c : q) doomed.push_back(std::move(c));
          q.clear();
        }
        const bool stop = stop_;
        lock.unlock();
        for (Call& c : doomed) c.work->Complete(doom);
        if (stop) return;
        lock.lock();
        cv_.wait(lock, [&] { return stop_ || any_queued(); });
        continue;
      }
      std::vector<int> missing;
      for (int r = 0; r < world_; ++r) {
        if (queues_[r].empty()) missing.push_back(r);
      }
      if (missing.empty()) {
        std::vector<Call> calls;
        calls.reserve(world_);
        for (std::deque<Call>& q : queues_) {
          calls.push_back(std::move(q.front()));
          q.pop_front();
        }
        lock.unlock();
        const absl::Status s = Execute(calls);
        lock.lock();
        // Sticky before any rank sees its Work done: a rank that returns
        // from Wait() and issues again must find the group failed.
        if (!s.ok() && failed_.ok()) failed_ = s;
        lock.unlock();
        for (Call& c : calls) c.work->Complete(s);
        lock.lock();
        continue;
      }
      if (static_cast<int>(missing.size()) == world_) {  // nothing issued
        cv_.wait(lock);
        continue;
      }
      const Call& head = FirstHead();
      std::vector<int> gone;
      for (int r : missing) {
        if (left_[r]) gone.push_back(r);
      }
      if (!gone.empty()) {
        failed_ = absl::AbortedError(absl::StrCat(
            "loopback: ", Describe(head), " cannot complete: rank(s) ", absl::StrJoin(gone, ","),
            " left the group"));
        continue;
      }
      const absl::Time deadline = head.issued + options_.timeout;
      if (absl::Now() >= deadline) {
        failed_ = absl::DeadlineExceededError(absl::StrCat(
            "loopback: ", Describe(head), " timed out after ",
            absl::FormatDuration(options_.timeout), ": rank(s) ", absl::StrJoin(missing, ","),
            " never issued it"));
        continue;
      }
      cv_.wait_until(lock, absl::ToChronoTime(deadline));
    }
  }

  // The earliest-issued pending call (some queue is non-empty). mu_ held.
  const Call& FirstHead() const {
    const Call* best = nullptr;
    for (const std::deque<Call>& q : queues_) {
      if (!q.empty() && (best == nullptr || q.front().issued < best->issued)) best = &q.front();
    }
    return *best;
  }

  // Runs one collective: every rank's call, rank r at calls[r]. Compares
  // them first, so that on a mismatch no buffer is touched.
  absl::Status Execute(const std::vector<Call>& calls) const {
    const Call& ref = calls[0];
    for (int r = 1; r < world_; ++r) {
      if (!SameCall(calls[r], ref)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "collective mismatch across ranks: rank 0 called ", Describe(ref), " but rank ", r,
            " called ", Describe(calls[r])));
      }
    }
    for (const Call& c : calls) c.work->MarkStarted();
    const size_t bytes = ref.count * DataTypeSize(ref.type);
    if (bytes == 0) return absl::OkStatus();
    switch (ref.kind) {
      case Kind::kAllReduce: {
        // Rank order, into a buffer of its own: in-place calls alias their
        // input and output, and every rank must see the same bits.
        std::vector<unsigned char> sum(bytes);
        std::memcpy(sum.data(), calls[0].send, bytes);
        for (int r = 1; r < world_; ++r) {
          Reduce(sum.data(), calls[r].send, sum.data(), ref.count, ref.type, ref.op);
        }
        if (ref.op == ReduceOp::kAvg) FinishAvg(sum.data(), ref.count, ref.type, world_);
        for (const Call& c : calls) std::memcpy(c.recv, sum.data(), bytes);
        break;
      }
      case Kind::kBroadcast: {
        const std::vector<unsigned char> data(
            static_cast<const unsigned char*>(calls[ref.root].recv),
            static_cast<const unsigned char*>(calls[ref.root].recv) + bytes);
        for (int r = 0; r < world_; ++r) {
          if (r != ref.root) std::memcpy(calls[r].recv, data.data(), bytes);
        }
        break;
      }
      case Kind::kAllGather: {
        std::vector<unsigned char> all(bytes * world_);
        for (int r = 0; r < world_; ++r) std::memcpy(all.data() + r * bytes, calls[r].send, bytes);
        for (const Call& c : calls) std::memcpy(c.recv, all.data(), all.size());
        break;
      }
      case Kind::kBarrier:
        break;
    }
    return absl::OkStatus();
  }

  const int world_;
  const LoopbackOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Call>> queues_;  // guarded by mu_
  std::vector<uint64_t> next_seq_;        // guarded by mu_
  std::vector<bool> left_;                // guarded by mu_
  absl::Status failed_;                   // guarded by mu_; sticky
  bool stop_ = false;                     // guarded by mu_
  std::thread thread_;                    // started last, joined first
};

class LoopbackCommunicator final : public Communicator {
 public:
  LoopbackCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  ~LoopbackCommunicator() override { group_->Leave(rank_); }

  int rank() const override { return rank_; }
  int size() const override { return group_->world(); }
  std::string backend() const override { return "loopback"; }
  MemoryKind memory() const override { return MemoryKind::kHost; }

 protected:
  absl::StatusOr<std::shared_ptr<Work>> DoIssue(const CollectiveArgs& a) override {
    Call c;
    static_cast<CollectiveArgs&>(c) = a;
    return group_->Issue(rank_, std::move(c));
  }

 private:
  const std::shared_ptr<Group> group_;
  const int rank_;
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateLoopbackGroup(
    int world, const LoopbackOptions& options) {
  if (world < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("loopback group: the world size must be at least 1, got ", world));
  }
  if (absl::Status s = ValidateCollectiveTimeout("loopback", options.timeout); !s.ok()) return s;
  auto group = std::make_shared<Group>(world, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.reserve(world);
  for (int r = 0; r < world; ++r) comms.push_back(std::make_unique<LoopbackCommunicator>(group, r));
  return comms;
}

}  // namespace fusebox::comm::testing
