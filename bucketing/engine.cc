#include "bucketing/engine.h"

#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "comm/thread_sched.h"
#include "comm/types.h"

namespace fusebox::bucketing {

namespace {

// Gives back one wait slice to check for shutdown while waiting on a Work.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(20);

}  // namespace

Engine::Engine(comm::Communicator& comm, GradientLayout layout, EngineOptions options)
    : comm_(comm),
      layout_(std::move(layout)),
      options_(std::move(options)),
      direct_(comm.memory() == comm::MemoryKind::kDevice),
      device_(direct_ ? comm.device() : options_.device),
      epoch_(std::chrono::steady_clock::now()),
      epoch_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(epoch_.time_since_epoch()).count()) {
  if (options_.record_timeline) {
    timeline_ = std::make_unique<Timeline>(options_.max_timeline_events);
  }
  gate_->engine = this;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(comm::Communicator& comm,
                                                       GradientLayout layout, Plan plan,
                                                       EngineOptions options) {
  if (options.max_in_flight < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "engine: max_in_flight is %d, it must be at least 1", options.max_in_flight));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("engine: timeout must be positive");
  }
  // Note [A device communicator]: the engine works on its device.
  const bool direct = comm.memory() == comm::MemoryKind::kDevice;
  if (direct) {
    if (comm.device() == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "engine: the %s communicator works on device memory but names no device",
          comm.backend()));
    }
    if (options.device != nullptr && options.device != comm.device()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "engine: EngineOptions::device (%s) is not the %s communicator's device (%s); with a "
          "device communicator the engine works on the communicator's device",
          options.device->name(), comm.backend(), comm.device()->name()));
    }
    if (options.schedule != Schedule::kPlanOrder) {
      return absl::InvalidArgumentError(
          "engine: with a device communicator the schedule must be plan order (the "
          "forward-priority schedule's votes are written and read by the host)");
    }
  }
  const comm::MemoryKind want = options.device != nullptr || direct ? comm::MemoryKind::kDevice
                                                                    : comm::MemoryKind::kHost;
  for (const TensorSpec& t : layout.tensors()) {
    if (t.memory != want) {
      return absl::InvalidArgumentError(
          want == comm::MemoryKind::kHost
              ? absl::StrFormat("engine: tensor \"%s\" is in device memory; pass the device it "
                                "lives on (EngineOptions::device) or a device communicator",
                                t.name)
              : absl::StrFormat("engine: tensor \"%s\" is in host memory, but "
                                "EngineOptions::device says the gradients live on a device (one "
                                "engine per memory kind)",
                                t.name));
    }
  }
  if ((options.device != nullptr || direct) &&
      (options.external_buffers || options.on_tensor_reduced || options.on_bucket_reduced)) {
    return absl::InvalidArgumentError(
        "engine: device gradients go through the engine's own buffers and finish with an "
        "event (finished_event); external buffers and the per-tensor/per-bucket callbacks are "
        "for host gradients");
  }
  if (options.external_buffers && options.schedule != Schedule::kPlanOrder) {
    return absl::InvalidArgumentError(
        "engine: external buffers need the plan-order schedule (votes have no room in the "
        "caller's buckets)");
  }
  std::unique_ptr<Engine> engine(new Engine(comm, std::move(layout), std::move(options)));
  if (comm::Device* device = engine->device_; device != nullptr) {
    for (auto* stream : {&engine->copy_in_, &engine->copy_out_}) {
      absl::StatusOr<std::unique_ptr<comm::DeviceStream>> made = device->CreateStream();
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            absl::StrCat("engine: creating a copy stream on ", device->name(),
                                         ": ", made.status().message()));
      }
      *stream = *std::move(made);
    }
  }
  if (absl::Status s = engine->Install(std::move(plan)); !s.ok()) return s;
  if (absl::Status s = engine->VerifyAcrossRanks(); !s.ok()) return s;
  engine->worker_ = std::thread([e = engine.get()] {
    pthread_setname_np(pthread_self(), "fb-engine");  // for profilers and `top -H`
    if (e->options_.worker_nice != 0 || e->options_.worker_slice > absl::ZeroDuration()) {
      absl::Status s =
          comm::SetThisThreadScheduling(e->options_.worker_nice, e->options_.worker_slice);
      std::lock_guard<std::mutex> lock(e->mu_);
      e->worker_scheduling_ = std::move(s);
    }
    e->WorkerLoop();
  });
  return engine;
}

Engine::~Engine() {
  {
    // No completion callback reaches the engine from here on (Note [Freeing
    // a slot where the collective completes]); the worker frees the rest.
    std::lock_guard<std::mutex> gate(gate_->mu);
    gate_->engine = nullptr;
  }
  // Copies still queued on the device streams run first: the copy-in
  // stream's host functions take mu_, and the copies use the buffers.
  if (copy_in_ != nullptr) (void)device_->SynchronizeStream(*copy_in_);
  if (copy_out_ != nullptr) (void)device_->SynchronizeStream(*copy_out_);
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (failed_.ok()) {
      cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.timeout),
                   [&] { return in_flight_ == 0; });
    }
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

double Engine::NowUs() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_)
      .count();
}

absl::Status Engine::Install(Plan plan) {
  if (absl::Status s = ValidatePlan(layout_, plan); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: plan \"", plan.name, "\" does not fit the layout: ", s.message()));
  }
  const int nb = static_cast<int>(plan.buckets.size());
  if (options_.external_buffers) {
    std::vector<int> seen(layout_.size(), 0);
    for (const Bucket& b : plan.buckets) {
      for (const Slice& s : b.slices) {
        if (s.offset != 0 || s.count != layout_.tensor(s.tensor).numel || seen[s.tensor]++ > 0) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "engine: plan \"%s\" splits tensor %d (\"%s\"); with external buffers every "
              "tensor lies whole in one bucket",
              plan.name, s.tensor, layout_.tensor(s.tensor).name));
        }
      }
    }
  }
  int vote_slots = 0;
  if (options_.schedule == Schedule::kForwardPriority) {
    if (nb > kMaxPriorityBuckets) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "engine: the forward-priority schedule handles at most %d buckets; plan \"%s\" has %d",
          kMaxPriorityBuckets, plan.name, nb));
    }
    for (const Bucket& b : plan.buckets) {
      const int limit = MaxVotingRanks(b.dtype);
      if (comm_.size() > limit) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "engine: the forward-priority schedule's votes are exact in %s up to %d ranks, not "
            "%d; use the plan-order schedule",
            comm::DataTypeName(b.dtype), limit, comm_.size()));
      }
    }
    vote_slots = nb;
  }
  // The old plan's buffers go first when no collective still holds them,
  // so that a plan swap never needs two sets of fusion buffers (they can be
  // most of a rank's memory); or, with options_.retain_plans, they are kept
  // for a later switch back (a tuner alternating plans pays no fresh
  // allocation, page faults or backend registration on each switch). From
  // here on a failure fails the engine.
  const uint64_t hash = PlanHash(plan);
  if (copy_out_ != nullptr) {
    // The last iteration's copies back may still read the buffers that go
    // now. (The copy-out stream runs no host functions, so waiting here
    // under mu_ cannot deadlock.)
    if (absl::Status s = device_->SynchronizeStream(*copy_out_); !s.ok()) {
      FailLocked(s);
      return s;
    }
  }
  std::shared_ptr<FusionBuffers> reuse;
  if (buffers_ != nullptr) {
    if (options_.retain_plans > 0) {
      retained_.emplace_front(plan_hash_, buffers_);
    } else if (buffers_.use_count() == 1) {
      std::fill(storage_.begin(), storage_.end(), nullptr);
    }
    buffers_.reset();
  }
  for (auto it = retained_.begin(); it != retained_.end(); ++it) {
    if (it->first == hash && it->second->vote_slots() == vote_slots) {
      reuse = it->second;
      retained_.erase(it);
      break;
    }
  }
  while (static_cast<int>(retained_.size()) > options_.retain_plans) retained_.pop_back();
  std::shared_ptr<FusionBuffers> buffers = reuse;
  if (buffers == nullptr) {
    absl::StatusOr<std::shared_ptr<FusionBuffers>> made = FusionBuffers::Allocate(
        plan, vote_slots, device_, direct_, /*allocate=*/!options_.external_buffers);
    if (!made.ok()) {
      if (buffers_ == nullptr) FailLocked(made.status());  // no plan left to run
      return made.status();
    }
    buffers = *std::move(made);
  }
  std::vector<std::vector<Placement>> placements = PlaceSlices(plan, layout_.size());
  std::vector<int> slices_per_bucket(nb, 0);
  for (int b = 0; b < nb; ++b) {
    slices_per_bucket[b] = static_cast<int>(plan.buckets[b].slices.size());
  }
  LaunchOrder order(options_.schedule, options_.max_in_flight, ForwardPriorities(plan));
  // Staging buffers are no place for a device gradient.
  std::vector<void*> storage =
      TensorViews(layout_, placements, *buffers, /*views=*/device_ == nullptr || direct_);
  plan_hash_ = hash;
  plan_ = std::move(plan);
  placements_ = std::move(placements);
  slices_per_bucket_ = std::move(slices_per_bucket);
  order_ = std::move(order);
  vote_slots_ = vote_slots;
  buffers_ = std::move(buffers);
  storage_ = std::move(storage);
  marked_.assign(layout_.size(), 0);
  grads_.assign(layout_.size(), nullptr);
  external_.assign(nb, nullptr);
  pending_slices_.assign(nb, 0);
  done_.assign(nb, 0);
  launch_us_.assign(nb, 0);
  ready_at_us_.assign(nb, 0);
  freed_at_us_.assign(nb, 0);
  on_completion_.assign(nb, 0);
  ResetIterationLocked();
  return absl::OkStatus();
}

absl::Status Engine::VerifyAcrossRanks() {
  if (!options_.verify_across_ranks || comm_.size() == 1) return absl::OkStatus();
  const int n = comm_.size();
  int64_t mine[2] = {static_cast<int64_t>(layout_.Hash()), static_cast<int64_t>(plan_hash_)};
  std::vector<int64_t> all(2 * static_cast<size_t>(n), 0);
  if (absl::Status s = GatherHashes(mine, all); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("engine: checking layout and plan agreement "
                                               "across ranks: ",
                                               s.message()));
  }
  std::vector<std::string> differ;
  for (int r = 1; r < n; ++r) {
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) {
      differ.push_back(absl::StrFormat("rank %d has layout %016x plan %016x", r,
                                       static_cast<uint64_t>(all[2 * r]),
                                       static_cast<uint64_t>(all[2 * r + 1])));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "engine (rank %d): ranks disagree on the gradient layout or plan: rank 0 has layout %016x "
      "plan %016x; %s",
      comm_.rank(), static_cast<uint64_t>(all[0]), static_cast<uint64_t>(all[1]),
      absl::StrJoin(differ, "; ")));
}

absl::Status Engine::GatherHashes(const int64_t (&mine)[2], std::vector<int64_t>& all) {
  if (!direct_) {
    auto work = comm_.AllGather(mine, all.data(), 2, comm::DataType::kInt64);
    if (!work.ok()) return work.status();
    return (*work)->WaitFor(options_.timeout);
  }
  // A device communicator gathers device memory: in through the copy-in
  // stream, synchronised before the call (the collective reads what its own
  // stream finds), out through the copy-out stream once it completed.
  const size_t bytes = (2 + all.size()) * sizeof(int64_t);
  absl::StatusOr<void*> made = device_->Allocate(bytes);
  if (!made.ok()) return made.status();
  auto* dev = static_cast<int64_t*>(*made);
  absl::Status s = device_->CopyAsync(dev, mine, sizeof(mine), *copy_in_);
  if (s.ok()) s = device_->SynchronizeStream(*copy_in_);
  if (s.ok()) {
    auto work = comm_.AllGather(dev, dev + 2, 2, comm::DataType::kInt64);
    s = work.ok() ? (*work)->WaitFor(options_.timeout) : work.status();
    // A collective that did not complete may still write `dev`: leaked, not freed.
    if (!s.ok() && work.ok() && !(*work)->Test()) return s;
  }
  if (s.ok()) s = device_->CopyAsync(all.data(), dev + 2, all.size() * sizeof(int64_t), *copy_out_);
  if (s.ok()) s = device_->SynchronizeStream(*copy_out_);
  device_->Free(dev);
  return s;
}

void* Engine::TensorStorage(int id) const {
  if (id < 0 || id >= layout_.size()) return nullptr;
  return storage_[id];
}

void Engine::ResetIterationLocked() {
  std::fill(marked_.begin(), marked_.end(), 0);
  std::fill(grads_.begin(), grads_.end(), nullptr);
  std::copy(slices_per_bucket_.begin(), slices_per_bucket_.end(), pending_slices_.begin());
  pending_tensor_slices_.resize(layout_.size());
  for (int id = 0; id < layout_.size(); ++id) {
    pending_tensor_slices_[id] = static_cast<int>(placements_[id].size());
  }
  order_.Reset();
  std::fill(done_.begin(), done_.end(), 0);
  marked_count_ = 0;
  std::fill(external_.begin(), external_.end(), nullptr);
  if (options_.external_buffers) {
    // Tensors in no bucket (zero elements) can never arrive with one.
    for (int id = 0; id < layout_.size(); ++id) {
      if (placements_[id].empty()) {
        marked_[id] = 1;
        ++marked_count_;
      }
    }
  }
  last_issued_index_ = -1;
  std::fill(freed_at_us_.begin(), freed_at_us_.end(), 0.0);
  std::fill(on_completion_.begin(), on_completion_.end(), 0);
  ++generation_;
  done_count_ = 0;
  started_ = false;
  current_ = IterationStats{};
  current_.iteration = iteration_;
  current_.buckets = static_cast<int>(plan_.buckets.size());
  if (options_.record_ready_times) current_.ready_us.assign(layout_.size(), 0.0);
}

void Engine::SetPolicy(std::unique_ptr<PlanPolicy> policy) {
  std::lock_guard<std::mutex> lock(mu_);
  policy_ = std::move(policy);
}

absl::Status Engine::StartIteration() {
  const double now = NowUs();
  std::optional<IterationStats> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    if (started_) return absl::OkStatus();
    if (!history_.empty() && history_.back().next_start_us == 0) {
      history_.back().next_start_us = now;
      last = history_.back();
    }
  }
  // Outside the lock: the policy may run collectives and SetPlan takes it.
  if (policy_ != nullptr && last.has_value()) {
    absl::StatusOr<std::optional<Plan>> next = policy_->OnIterationEnd(*last, plan_);
    if (!next.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      FailLocked(next.status());
      return failed_;
    }
    if (next->has_value()) {
      if (absl::Status s = SetPlan(**std::move(next)); !s.ok()) return s;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  if (!started_) {
    started_ = true;
    current_.start_us = now;
    if (timeline_) timeline_->Instant("step start", Track::kCompute, now, iteration_);
  }
  return absl::OkStatus();
}

void Engine::FailLocked(absl::Status status) {
  if (failed_.ok()) {
    failed_ = absl::Status(status.code(), absl::StrFormat("fusebox engine (rank %d, iteration "
                                                          "%d): %s",
                                                          comm_.rank(), iteration_,
                                                          status.message()));
  }
  cv_.notify_all();
}

absl::Status Engine::MarkBucketReady(int bucket, void* data, int64_t numel) {
  if (!options_.external_buffers) {
    return absl::FailedPreconditionError(
        "MarkBucketReady: the engine owns its fusion buffers (EngineOptions::external_buffers "
        "is off); use MarkReady");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  const int nb = static_cast<int>(plan_.buckets.size());
  if (bucket < 0 || bucket >= nb) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MarkBucketReady: bucket %d is not in plan \"%s\" (buckets 0..%d)", bucket, plan_.name,
        nb - 1));
  }
  const Bucket& b = plan_.buckets[bucket];
  if (numel != b.count()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MarkBucketReady: bucket %d has %d elements, plan \"%s\" says %d", bucket, numel,
        plan_.name, b.count()));
  }
  if (data == nullptr && numel > 0) {
    return absl::InvalidArgumentError(absl::StrFormat("MarkBucketReady: bucket %d: null data", bucket));
  }
  for (const Slice& s : b.slices) {
    if (marked_[s.tensor]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "MarkBucketReady: bucket %d was already marked ready in iteration %d", bucket,
          iteration_));
    }
  }
  const double now = NowUs();
  if (!started_) {
    started_ = true;
    current_.start_us = now;
  }
  external_[bucket] = static_cast<char*>(data);
  for (const Slice& s : b.slices) {
    marked_[s.tensor] = 1;
    ++marked_count_;
    if (options_.record_ready_times) current_.ready_us[s.tensor] = now - current_.start_us;
    if (timeline_) {
      timeline_->Instant(layout_.tensor(s.tensor).name, Track::kGradients, now, iteration_, -1,
                         s.tensor, layout_.bytes(s.tensor));
    }
  }
  pending_slices_[bucket] = 0;
  order_.Complete(bucket);
  ready_at_us_[bucket] = now;
  if (marked_count_ == layout_.size()) {
    current_.backward_end_us = now;
    if (timeline_) timeline_->Instant("backward end", Track::kCompute, now, iteration_);
  }
  LaunchReadyLocked();
  return absl::OkStatus();
}

absl::Status Engine::CheckMark(int id, const void* grad, int64_t numel) const {
  if (id < 0 || id >= layout_.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "MarkReady: tensor id %d is not in the layout (ids 0..%d)", id, layout_.size() - 1));
  }
  const TensorSpec& t = layout_.tensor(id);
  if (numel != t.numel) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MarkReady: tensor %d (\"%s\"): gradient has %d elements, the layout "
                        "says %d",
                        id, t.name, numel, t.numel));
  }
  if (grad == nullptr && numel > 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("MarkReady: tensor %d (\"%s\"): null gradient", id, t.name));
  }
  return absl::OkStatus();
}

absl::Status Engine::MarkTensorLocked(int id, void* grad, double now) {
  if (!failed_.ok()) return failed_;
  if (marked_[id]) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "MarkReady: tensor %d (\"%s\") was already marked ready in iteration %d", id,
        layout_.tensor(id).name, iteration_));
  }
  marked_[id] = 1;
  grads_[id] = grad;
  if (!started_) {
    started_ = true;
    current_.start_us = now;
  }
  if (options_.record_ready_times) current_.ready_us[id] = now - current_.start_us;
  return absl::OkStatus();
}

absl::Status Engine::MarkReady(int id, void* grad, int64_t numel) {
  if (options_.external_buffers) {
    return absl::FailedPreconditionError(
        "MarkReady: the caller owns the buckets (EngineOptions::external_buffers); use "
        "MarkBucketReady");
  }
  if (device_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "MarkReady: the gradients live on ", device_->name(),
        " (EngineOptions::device or a device communicator); use MarkReadyOnDevice with the "
        "producer's event"));
  }
  if (absl::Status s = CheckMark(id, grad, numel); !s.ok()) return s;
  const TensorSpec& t = layout_.tensor(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = NowUs();
    if (absl::Status s = MarkTensorLocked(id, grad, now); !s.ok()) return s;
  }
  // Copy in outside the lock: threads marking different tensors copy in
  // parallel into disjoint parts of the buffers.
  const size_t esize = comm::DataTypeSize(t.dtype);
  const bool view = grad != nullptr && grad == storage_[id];
  const double t0 = NowUs();
  if (!view) {
    for (const Placement& p : placements_[id]) {
      if (p.count == 0) continue;  // (a zero-size bucket has no buffer)
      std::memcpy(buffers_->data(p.bucket) + p.buffer_offset * esize,
                  static_cast<const char*>(grad) + p.tensor_offset * esize, p.count * esize);
    }
  }
  const double t1 = NowUs();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (timeline_) {
      timeline_->Instant(t.name, Track::kGradients, t0, iteration_, -1, id,
                         static_cast<int64_t>(t.numel * esize));
      if (!view && t.numel > 0) {
        timeline_->Span("copy in", Track::kGradients, t0, t1 - t0, iteration_, -1, id,
                        static_cast<int64_t>(t.numel * esize));
      }
    }
    if (!view) current_.copy_in_us += t1 - t0;
    SlicesInLocked(id, t1);
  }
  // A tensor with no slices (zero elements, none assigned) is reduced now.
  if (placements_[id].empty() && options_.on_tensor_reduced) options_.on_tensor_reduced(id);
  return absl::OkStatus();
}

void Engine::SlicesInLocked(int id, double at_us) {
  for (const Placement& p : placements_[id]) {
    if (--pending_slices_[p.bucket] == 0) {
      order_.Complete(p.bucket);
      ready_at_us_[p.bucket] = at_us;
    }
  }
  if (++marked_count_ == layout_.size()) {
    current_.backward_end_us = at_us;
    if (timeline_) timeline_->Instant("backward end", Track::kCompute, at_us, iteration_);
  }
  LaunchReadyLocked();
}

absl::Status Engine::MarkReadyOnDevice(int id, void* grad, int64_t numel,
                                       const comm::DeviceEvent* ready) {
  comm::Device* device = device_;
  if (device == nullptr) {
    return absl::FailedPreconditionError(
        "MarkReadyOnDevice: the engine reduces host gradients (EngineOptions::device is not "
        "set and the communicator is on the host); use MarkReady");
  }
  if (absl::Status s = CheckMark(id, grad, numel); !s.ok()) return s;
  const TensorSpec& t = layout_.tensor(id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double now = NowUs();
    if (absl::Status s = MarkTensorLocked(id, grad, now); !s.ok()) return s;
    if (timeline_) {
      timeline_->Instant(t.name, Track::kGradients, now, iteration_, -1, id, layout_.bytes(id));
    }
    if (placements_[id].empty()) {  // nothing to copy (zero elements): in now, so that
      SlicesInLocked(id, now);      // no host function can outlive the iteration
      return absl::OkStatus();
    }
  }
  // Behind the producer's event, the slices' copies into the fusion
  // buffers (none for a view), then: staged, the host function that counts
  // them in (and may launch their buckets); with a device communicator,
  // counting them in at once (Note [A device communicator]). Buffers and
  // placements stay fixed until the iteration ends: SetPlan refuses while
  // any tensor is marked.
  const size_t esize = comm::DataTypeSize(t.dtype);
  const bool view = direct_ && grad == storage_[id];
  absl::Status s;
  {
    std::lock_guard<std::mutex> enqueue(device_mu_);
    if (ready != nullptr) s = device->WaitEvent(*copy_in_, *ready);
    for (const Placement& p : placements_[id]) {
      if (!s.ok() || view) break;
      if (p.count == 0) continue;
      s = device->CopyAsync(buffers_->data(p.bucket) + p.buffer_offset * esize,
                            static_cast<const char*>(grad) + p.tensor_offset * esize,
                            p.count * esize, *copy_in_);
    }
    if (s.ok() && !direct_) {
      s = device->LaunchHostFunc(*copy_in_, [this, id] {
        std::lock_guard<std::mutex> lock(mu_);
        SlicesInLocked(id, NowUs());
      });
    }
  }
  if (!s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(absl::Status(s.code(), absl::StrFormat("copying tensor %d (\"%s\") in from %s: %s",
                                                      id, t.name, device->name(), s.message())));
    return failed_;
  }
  if (direct_) {
    std::lock_guard<std::mutex> lock(mu_);
    SlicesInLocked(id, NowUs());
  }
  return absl::OkStatus();
}

absl::Status Engine::worker_scheduling() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_scheduling_;
}

std::shared_ptr<comm::DeviceEvent> Engine::finished_event() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void Engine::LaunchReadyLocked() {
  bool launched = false;
  while (failed_.ok()) {
    const int b = order_.Next();  // Note [Launch order]
    if (b < 0) break;             // all launched, the window full, or wait for b
    Launch(b);
    launched = true;
  }
  if (launched) cv_.notify_all();
}

void Engine::Launch(int b) {
  const int index = order_.launches();  // k: this iteration's k-th launch
  const Bucket& bucket = plan_.buckets[b];
  const int64_t count = bucket.count() + vote_slots_;
  // Stamped before the collective is prepared (votes, a device event) and
  // issued: the communicator's executor may start (and mark the start of)
  // the collective before the call returns here, when it takes the core
  // from this thread, and a stamp after the call then put the launch after
  // the start, hid that wait from launch-to-start (clamped to 0) and counted
  // it as held by the window.
  const double launch_us = NowUs();
  std::shared_ptr<comm::Work> work;
  std::shared_ptr<std::atomic<bool>> reported;
  if (count == 0) {
    work = comm::Work::Done(absl::OkStatus());  // only zero-size tensors
    if (options_.external_buffers && options_.on_bucket_reduced) {
      options_.on_bucket_reduced(b, absl::OkStatus());
    }
  } else {
    last_issued_index_ = index;
    if (vote_slots_ > 0) {
      WriteVotes(order_, bucket.dtype, buffers_->votes(b, bucket));
    }
    char* data = options_.external_buffers ? external_[b] : buffers_->data(b);
    // Issued in launch order under mu_, so concurrent MarkReady calls cannot
    // reorder them (Note [Launch order]). Averaging rides in the backend's
    // last pass over the data (kAvg: the exact sum divided once by the
    // world size, in the element type).
    const comm::ReduceOp op = options_.average ? comm::ReduceOp::kAvg : comm::ReduceOp::kSum;
    absl::StatusOr<std::shared_ptr<comm::Work>> issued;
    if (direct_) {
      // Note [A device communicator]: the collective waits on the device
      // for every copy in (and producer event) enqueued so far, which
      // includes all of this bucket's.
      absl::StatusOr<std::shared_ptr<comm::DeviceEvent>> in = device_->RecordEvent(*copy_in_);
      issued = in.ok() ? comm_.AllReduceAfter(**in, data, data, static_cast<size_t>(count),
                                              bucket.dtype, op)
                       : in.status();
    } else {
      issued = comm_.AllReduce(data, data, static_cast<size_t>(count), bucket.dtype, op);
    }
    if (!issued.ok()) {
      FailLocked(absl::Status(issued.status().code(), absl::StrFormat("launching bucket %d: %s", b,
                                                                      issued.status().message())));
      return;
    }
    work = *std::move(issued);
    work->OnComplete([keep = buffers_](const absl::Status&) {});
    if (options_.external_buffers && options_.on_bucket_reduced) {
      // The worker waits for this to have run before it counts the bucket
      // done, so every report precedes Finish()'s return (a Work runs its
      // callbacks just after it reports done). Registered before the next
      // one, so that the report does not wait behind the launches it admits.
      reported = std::make_shared<std::atomic<bool>>(false);
      work->OnComplete([done = options_.on_bucket_reduced, b, reported](const absl::Status& s) {
        done(b, s);
        reported->store(true, std::memory_order_release);
      });
    }
    if (options_.launch_on_completion && !direct_ && device_ == nullptr) {
      // Note [Freeing a slot where the collective completes]. Both locks
      // are tried, never waited for: the worker frees the slot otherwise.
      auto armed = std::make_shared<std::atomic<bool>>(false);
      work->OnComplete([gate = gate_, armed, generation = generation_, index,
                        b](const absl::Status& s) {
        if (!s.ok() || !armed->load(std::memory_order_acquire)) return;
        std::unique_lock<std::mutex> lock(gate->mu, std::try_to_lock);
        if (lock.owns_lock() && gate->engine != nullptr) {
          gate->engine->OnLaunchComplete(generation, index, b);
        }
      });
      armed->store(true, std::memory_order_release);
    }
  }
  order_.Launched(b);
  launch_us_[b] = launch_us;
  current_.launch_order.push_back(b);
  launched_.push_back(Launched{b, index, std::move(work), std::move(reported)});
  ++in_flight_;
}

bool Engine::FreeSlotLocked(int index, int bucket, bool read_votes) {
  if (!order_.Free(index)) return false;
  freed_at_us_[bucket] = NowUs();
  if (read_votes && vote_slots_ > 0) {
    // Launch index + W is chosen by these (Note [Launch order]).
    const Bucket& b = plan_.buckets[bucket];
    order_.Agreed(index, ReadVotes(buffers_->votes(bucket, b), vote_slots_, b.dtype,
                                   options_.average ? 1.0 : comm_.size()));
  }
  return true;
}

void Engine::OnLaunchComplete(int64_t generation, int index, int bucket) {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the worker frees it
  if (generation != generation_ || !failed_.ok()) return;
  if (!FreeSlotLocked(index, bucket, /*read_votes=*/true)) return;
  // Launch only where the communicator would otherwise go idle: a
  // collective issued after this one and still queued starts only once this
  // callback returns, and the worker launches meanwhile (Note [Freeing a
  // slot where the collective completes]).
  if (last_issued_index_ > index) return;
  const int before = order_.launches();
  LaunchReadyLocked();
  current_.launches_on_completion += order_.launches() - before;
  for (int k = before; k < order_.launches(); ++k) {
    on_completion_[current_.launch_order[k]] = 1;
  }
}

absl::Status Engine::CopyBack(int b) {
  if (options_.external_buffers) return absl::OkStatus();  // reduced in the caller's memory
  const Bucket& bucket = plan_.buckets[b];
  const size_t esize = comm::DataTypeSize(bucket.dtype);
  char* buffer = buffers_->data(b);
  int64_t offset = 0;
  for (const Slice& s : bucket.slices) {
    if (s.count > 0) {
      char* src = buffer + offset * esize;
      char* dst = static_cast<char*>(grads_[s.tensor]) + s.offset * esize;
      if (dst == src) {
        // A view: reduced in place.
      } else if (device_ != nullptr) {
        // Enqueued only: finished_event() says when it is done. (The
        // collective is: its Work completed.)
        if (absl::Status st = device_->CopyAsync(dst, src, s.count * esize, *copy_out_);
            !st.ok()) {
          return absl::Status(st.code(), absl::StrCat("copying back to ", device_->name(),
                                                      ": ", st.message()));
        }
      } else {
        std::memcpy(dst, src, s.count * esize);
      }
    }
    offset += s.count;
  }
  return absl::OkStatus();
}

void Engine::WorkerLoop() {
  for (;;) {
    Launched next;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !launched_.empty(); });
      if (launched_.empty()) return;  // stopping
      next = std::move(launched_.front());
      launched_.pop_front();
    }
    const absl::Time deadline = absl::Now() + options_.timeout;
    absl::Status status;
    for (;;) {
      status = next.work->WaitUntil(std::min(deadline, absl::Now() + kWaitSlice));
      if (next.work->Test()) {
        // The collective's own outcome: it may have completed just after
        // this slice of the wait expired, which returned DeadlineExceeded.
        status = next.work->status();
        break;
      }
      if (absl::Now() >= deadline) {
        status = absl::DeadlineExceededError(absl::StrFormat(
            "the allreduce of bucket %d did not complete within %s (a peer may be slow, stuck "
            "or gone)",
            next.bucket, absl::FormatDuration(options_.timeout)));
        break;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        status = absl::CancelledError("engine destroyed");
        break;
      }
    }
    if (next.reported != nullptr && next.work->Test()) {
      while (!next.reported->load(std::memory_order_acquire)) std::this_thread::yield();
    }
    const double complete_us = NowUs();
    // The collective is done: its slot in the window frees now, before the
    // copy back, so the next launch does not wait behind this bucket's copy
    // (Note [Launch order]). Its votes are what kForwardPriority chooses
    // launch next.index + W by.
    // (Or earlier, by the Work's completion callback, which leaves the
    // launch to this thread where later collectives are still queued: Note
    // [Freeing a slot where the collective completes].)
    const bool slot_freed = status.ok();
    if (slot_freed) {
      std::lock_guard<std::mutex> lock(mu_);
      // Freed here, or by the callback, which may have left the launch to
      // this thread.
      FreeSlotLocked(next.index, next.bucket, /*read_votes=*/true);
      LaunchReadyLocked();
    }
    // The copy alone (back_us) and when it ended: the launches above come
    // between the completion and the copy.
    double back_us = 0;
    const double copy_from_us = NowUs();
    double copied_at_us = copy_from_us;
    if (status.ok()) {
      status = CopyBack(next.bucket);
      copied_at_us = NowUs();
      back_us = copied_at_us - copy_from_us;
    }
    if (status.ok()) {
      if (options_.on_tensor_reduced) {
        // Only this thread touches the counters while buckets are pending;
        // done_count_ (below, under mu_) orders this before the reset.
        for (const Slice& s : plan_.buckets[next.bucket].slices) {
          if (--pending_tensor_slices_[s.tensor] == 0) options_.on_tensor_reduced(s.tensor);
        }
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
    if (!slot_freed) FreeSlotLocked(next.index, next.bucket, /*read_votes=*/false);
    if (!status.ok()) {
      FailLocked(absl::Status(status.code(), absl::StrFormat("bucket %d: %s", next.bucket,
                                                             status.message())));
      continue;
    }
    const Bucket& bucket = plan_.buckets[next.bucket];
    const int64_t bytes = bucket.count() * static_cast<int64_t>(comm::DataTypeSize(bucket.dtype));
    current_.comm_us += complete_us - launch_us_[next.bucket];
    current_.copy_back_us += back_us;
    // Launch-to-start: how long the bucket waited for the backend to begin
    // executing it (backends that mark starts; comm/work.h).
    // The part not spent queueing behind the previous collective (the
    // backend runs them in issue order) is the executor's reaction: from
    // the later of the launch and the previous completion to the start.
    double start_us = -1;
    if (const int64_t started = next.work->started_ns(); started > 0) {
      start_us = static_cast<double>(started - epoch_ns_) / 1e3;
      const double ready_us =
          std::max(launch_us_[next.bucket],
                   static_cast<double>(previous_completed_ns_ - epoch_ns_) / 1e3);
      current_.start_delay_us.push_back(std::max(0.0, start_us - launch_us_[next.bucket]));
      current_.start_reaction_us.push_back(std::max(0.0, start_us - ready_us));
    }
    previous_completed_ns_ = next.work->completed_ns();
    {
      BucketTiming bt;
      const double origin = current_.start_us;
      bt.bucket = next.bucket;
      bt.bytes = bytes;
      bt.launch_us = launch_us_[next.bucket] - origin;
      // (A bucket of zero-size tensors only is never marked: ready at launch.)
      bt.ready_us = ready_at_us_[next.bucket] >= origin
                        ? std::min(ready_at_us_[next.bucket] - origin, bt.launch_us)
                        : bt.launch_us;
      bt.start_us = start_us >= 0 ? start_us - origin : -1;
      const int64_t completed = next.work->completed_ns();
      bt.noticed_us = complete_us - origin;
      bt.done_us = completed > 0 ? std::min(bt.noticed_us,
                                            static_cast<double>(completed - epoch_ns_) / 1e3 - origin)
                                 : bt.noticed_us;
      bt.copied_us = copied_at_us - origin;
      bt.freed_us = freed_at_us_[next.bucket] - origin;  // freed above, or by its callback
      bt.on_completion = on_completion_[next.bucket] != 0;
      current_.bucket_times.push_back(bt);
    }
    if (timeline_) {
      if (start_us > launch_us_[next.bucket]) {
        timeline_->Span("waits to start", Track::kAllReduce, launch_us_[next.bucket],
                        start_us - launch_us_[next.bucket], iteration_, next.bucket, -1, bytes);
      }
      timeline_->Span(absl::StrCat("bucket ", next.bucket), Track::kAllReduce,
                      launch_us_[next.bucket], complete_us - launch_us_[next.bucket], iteration_,
                      next.bucket, -1, bytes);
      if (back_us > 0) {
        timeline_->Span("copy back", Track::kCopyBack, copy_from_us, back_us, iteration_,
                        next.bucket, -1, bytes);
      }
    }
    done_[next.bucket] = 1;
    ++done_count_;
    LaunchReadyLocked();
    cv_.notify_all();
  }
}

std::string Engine::DescribeMissingLocked() const {
  if (marked_count_ < layout_.size()) {
    std::vector<std::string> names;
    int missing = 0;
    for (int id = 0; id < layout_.size(); ++id) {
      if (marked_[id]) continue;
      if (++missing <= 8) names.push_back(absl::StrFormat("%d (\"%s\")", id, layout_.tensor(id).name));
    }
    return absl::StrFormat(
        "%d of %d gradients were never marked ready within %s: %s%s", missing, layout_.size(),
        absl::FormatDuration(options_.timeout), absl::StrJoin(names, ", "),
        missing > 8 ? absl::StrFormat(" and %d more", missing - 8) : "");
  }
  std::vector<std::string> buckets;
  for (size_t b = 0; b < done_.size(); ++b) {
    if (!done_[b]) buckets.push_back(absl::StrCat(b));
    if (buckets.size() == 16) break;
  }
  return absl::StrFormat("every gradient was marked ready but buckets [%s] were not reduced "
                         "within %s (a peer may be slow, stuck or gone)",
                         absl::StrJoin(buckets, ", "), absl::FormatDuration(options_.timeout));
}

absl::Status Engine::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!failed_.ok()) return failed_;
  const int nb = static_cast<int>(plan_.buckets.size());
  const bool done = cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.timeout), [&] {
    return done_count_ == nb || !failed_.ok();
  });
  if (!failed_.ok()) return failed_;
  if (!done) {
    FailLocked(absl::DeadlineExceededError(DescribeMissingLocked()));
    return failed_;
  }
  if (device_ != nullptr) {
    // The consumer waits on this; so do the next iteration's copies in,
    // which overwrite the fusion buffers the copies back read.
    absl::StatusOr<std::shared_ptr<comm::DeviceEvent>> event = device_->RecordEvent(*copy_out_);
    absl::Status s = event.status();
    if (s.ok()) {
      std::lock_guard<std::mutex> enqueue(device_mu_);
      s = device_->WaitEvent(*copy_in_, **event);
    }
    if (!s.ok()) {
      FailLocked(absl::Status(s.code(), absl::StrCat("ordering the copies back on ",
                                                     device_->name(), ": ", s.message())));
      return failed_;
    }
    finished_ = *std::move(event);
  }
  const double now = NowUs();
  if (!started_) current_.start_us = now;  // empty layout
  if (marked_count_ < layout_.size() || layout_.size() == 0) current_.backward_end_us = now;
  current_.finish_us = now;
  if (timeline_) timeline_->Instant("finish", Track::kCompute, now, iteration_);
  history_.push_back(current_);
  while (history_.size() > options_.stats_history) history_.pop_front();
  ++iteration_;
  ResetIterationLocked();
  return absl::OkStatus();
}

absl::Status Engine::SetPlan(Plan plan) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return failed_;
    if (started_ || marked_count_ > 0 || in_flight_ > 0) {
      return absl::FailedPreconditionError(
          "SetPlan: an iteration is in progress; call Finish() first");
    }
    if (absl::Status s = Install(std::move(plan)); !s.ok()) return s;
  }
  if (absl::Status s = VerifyAcrossRanks(); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    FailLocked(s);
    return failed_;
  }
  return absl::OkStatus();
}

IterationStats Engine::last_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return history_.empty() ? IterationStats{} : history_.back();
}

std::vector<IterationStats> Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<IterationStats>(history_.begin(), history_.end());
}

}  // namespace fusebox::bucketing
