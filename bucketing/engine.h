// Engine: the runtime that turns gradients marked ready one by one into
// fused allreduces that overlap with the rest of backward.
//
//   auto engine = Engine::Create(comm, layout, plan, options);   // collective
//   engine->SetPolicy(std::move(policy));       // optional (policy.h)
//   for each iteration:
//     engine->StartIteration();                 // the iteration (forward) starts
//     engine->MarkReady(id, grad, numel);       // any thread, once per tensor
//     engine->Finish();                         // grads now hold the average
//
// Note [Launch order] (in bucketing/launch_order.h, with the code that
// decides it): every rank launches the same sequence of buckets within a
// window of max_in_flight, in plan order or by forward priority with votes.
//
// Note [Freeing a slot where the collective completes]
// A launched bucket's window slot frees when its allreduce completes, and
// the freed slot admits the next launch. The engine's worker sees the
// completion by waking from its wait on the Work; with many buckets queued
// on a host communicator (communication-bound, 1-5 MiB buckets) that
// wake-up waited for a core taken by the communicator's progress thread
// (which runs at a higher priority, Note [Sharing a core with the progress
// thread] in comm/async_core.h), and the window's queue ran dry meanwhile:
// the gap report's launch-to-start term reached 14-18 ms of 65-75 ms
// iterations (ViT-B/16 at t(all) = 2 T_b, commit bbc8a60). So, on
// a host communicator with host gradients (not with EngineOptions::device,
// whose staging copies are ordered on the worker, nor on a device
// communicator), each launch also registers a completion callback that
// frees the slot and launches what it admits on the completing thread (the
// progress thread), if it can take the engine's locks at once (try_lock:
// the completing thread never waits behind another thread's lock);
// otherwise the worker does it as before. Such a thread may then issue
// collectives from inside a completion callback, which the communicator
// contract allows (comm/work.h forbids only blocking there). Slots free in
// launch order (freed_count_), so whichever of the two comes second finds
// the slot freed, and kForwardPriority's votes of launch k - W are read
// before launch k is chosen. A callback that runs inside OnComplete itself
// (the Work was done already, on the launching thread that holds the lock)
// or before Launch armed it does nothing, and one from an earlier iteration
// (generation_) or after the engine is gone (CompletionGate) neither. The
// copy back and the bookkeeping stay on the worker. Measured on 2 local
// ranks (commit bbc8a60): the many-bucket plans'
// launch-to-start term fell from 4-15 to 0-3 ms per iteration; their
// iteration times moved within the round-to-round scatter.
// A completion callback runs on the executing thread before it starts the
// next queued collective, so a launch made there delays every collective
// already queued behind the one that completed: with per-tensor buckets
// of ResNet-50 the executor's reaction (launch-to-start less queueing) had
// a median of 12-13 us where it was 0.0-0.2 us without launches on
// completion. So the callback frees the slot always but launches only
// where nothing issued after the completed collective is still
// outstanding (the communicator would otherwise go idle); otherwise the
// worker launches when it next takes the engine's lock after the
// completion (it may first finish copying back earlier buckets, while the
// communicator still has those later collectives to run). Against
// launching at every completion, 8 interleaved rounds
// (commit 7e1ba59): the reaction's median 12.9 -> 0.5 us,
// p99 58.8 -> 45.2 us (medians of rounds); in the communication-bound
// cells above (3 rounds) the launch-to-start term stayed at -0.3 to 3.3 ms
// per iteration where turning launches on completion off gives 0.2-12.7.
//
// Note [Fusion buffers and views] (in bucketing/fusion_buffers.h): each
// bucket's buffer holds its slices back to back; a tensor whole in one
// bucket can be computed in place there (TensorStorage); with external
// buffers the caller owns each bucket's memory.
//
// Note [Device gradients over a host communicator]
// With EngineOptions::device, gradients live in that device's memory and
// the communicator reduces host memory (UCX, MPI, a Gloo process group):
// the engine stages each bucket through a host fusion buffer (the device's
// AllocateHost: page-locked under CUDA), ordered by events on two streams
// of its own (Note [Device seam] in comm/device.h):
//
//   producer stream --ready event--> copy-in stream: device-to-host copies
//     of the gradient's slices, then a host function that counts them in;
//   the bucket's last slice counted in --> the host allreduce is launched
//     (from that host function: no CPU thread waits for the copies);
//   completion --> copy-out stream: host-to-device copies back into the
//     gradients;
//   Finish() --> records finished_event() on the copy-out stream: the
//     consumer's stream waits on it before it reads the gradients, and the
//     next iteration's copies-in wait on it before they overwrite the
//     host buffers.
//
// So bucket k+1's device-to-host copy runs while bucket k is reduced, and
// neither MarkReadyOnDevice nor Finish waits for a device copy (Finish
// waits for the host collectives, as on the host). No views: the fusion
// buffers are host memory (TensorStorage is null). on_tensor_reduced and
// external buffers are for host gradients only.
//
// Note [A device communicator]
// With a communicator on device memory (NCCL; Note [Device communicators]
// in comm/communicator.h) the fusion buffers are device memory of the
// communicator's device, and nothing crosses to the host:
//
//   producer stream --ready event--> copy-in stream: device-to-device
//     copies of the gradient's slices into the fusion buffer (none for a
//     view: a gradient computed in place at TensorStorage(id));
//   the bucket's last slice marked --> an event recorded on the copy-in
//     stream, and the collective issued with AllReduceAfter(that event):
//     it starts on the communicator's stream once every copy in (and
//     producer event) enqueued so far is done, which includes all of the
//     bucket's; the marking thread never waits for the device;
//   the Work completes (the result is in the fusion buffer) --> copy-out
//     stream: device-to-device copies back (none for views);
//   Finish() --> finished_event() as with staging.
//
// Marking counts a gradient in at once (the copy-in stream orders the
// data), so launches follow marking, as on the host. The schedule must be
// plan order (the votes of the forward-priority schedule are host data).
// Agreement checks (verify_across_ranks) gather through device memory.
#ifndef FUSEBOX_BUCKETING_ENGINE_H_
#define FUSEBOX_BUCKETING_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bucketing/fusion_buffers.h"
#include "bucketing/launch_order.h"
#include "bucketing/layout.h"
#include "bucketing/plan.h"
#include "bucketing/policy.h"
#include "bucketing/timeline.h"
#include "comm/communicator.h"
#include "comm/device.h"
#include "comm/work.h"

namespace fusebox::bucketing {

struct EngineOptions {
  // Buckets launched whose allreduce has not yet completed (copies back do
  // not hold a slot); at least 1.
  int max_in_flight = 4;
  // The worker thread's nice value (0: the caller's) and requested slice
  // (0: the kernel's default), as comm/thread_sched.h sets them: what it
  // needs to see a collective finish promptly on a core the communicator's
  // progress thread shares. Where they cannot be set the worker runs with
  // what was applied and worker_scheduling() says why.
  int worker_nice = 0;
  absl::Duration worker_slice = absl::ZeroDuration();
  // On a host communicator, a completed collective frees its window slot on
  // the thread that completed it, where the engine's lock is free at once,
  // and launches what that admits there when no later collective is still
  // queued (Note [Freeing a slot where the collective completes]); false:
  // only the worker does.
  bool launch_on_completion = true;
  // How the next bucket to launch is chosen (Note [Launch order] in
  // launch_order.h).
  Schedule schedule = Schedule::kPlanOrder;
  // Average across ranks (ReduceOp::kAvg: the exact sum divided once by the
  // world size in the element type), else sum.
  bool average = true;
  // How long Finish() (and the engine's wait for any one collective) may
  // take before it reports which gradients or buckets are missing.
  absl::Duration timeout = absl::Minutes(5);
  // Before the first iteration of a plan, check with an AllGather that every
  // rank has the same layout and plan (hashes); a mismatch fails on every
  // rank and names the ranks. Collective: all ranks must Create / SetPlan
  // together.
  bool verify_across_ranks = true;
  // Record a timeline (see timeline.h); off by default.
  bool record_timeline = false;
  size_t max_timeline_events = size_t{1} << 20;
  // Per-iteration statistics kept (oldest dropped first).
  size_t stats_history = 4096;
  // Fill IterationStats::ready_us (what an online tuner learns a profile
  // from); off by default (one double per tensor per iteration).
  bool record_ready_times = false;
  // Called once per tensor and iteration when every slice of it has been
  // reduced and copied back (so the caller's buffer holds the result): on
  // the engine's worker thread, before Finish() can return, or inside
  // MarkReady for a tensor with no slices. Must not block or call into the
  // engine. What a DDP hook completes its per-bucket futures from.
  std::function<void(int id)> on_tensor_reduced;
  // The caller owns the buckets' memory (Note [Fusion buffers and views]):
  // gradients arrive by MarkBucketReady only, plans must not split tensors
  // and the schedule must be kPlanOrder.
  bool external_buffers = false;
  // Fusion buffers of up to this many earlier plans are kept for a switch
  // back (what a tuner alternating candidates wants: no fresh allocation on
  // each switch); 0 frees them at once.
  int retain_plans = 0;
  // With external_buffers: called once per bucket and iteration when its
  // allreduce has completed, with the collective's status (results are in
  // place when it is OK), on the thread that completes the collective (the
  // backend's), the moment it completes: a DDP hook completes the bucket's
  // future from here with no further thread hop. Every call has returned
  // before Finish() does. Must not block or call into the engine.
  std::function<void(int bucket, const absl::Status& status)> on_bucket_reduced;
  // The device every gradient lives on (all of the layout's tensors are
  // MemoryKind::kDevice), reduced over a host communicator by staging (Note
  // [Device gradients over a host communicator]); null: host gradients.
  // Must outlive the engine.
  comm::Device* device = nullptr;
};

// One iteration, in microseconds on the engine's clock (NowUs()).
// One bucket's way through an iteration, in microseconds after
// IterationStats::start_us. perf/explain.h attributes the iteration's
// distance from the lower bound to these steps.
struct BucketTiming {
  int bucket = 0;
  int64_t bytes = 0;      // payload (votes excluded)
  double ready_us = 0;    // its last slice was marked (and copied in)
  double launch_us = 0;   // handed to the communicator
  double start_us = -1;   // the backend began executing it; -1: it does not say
  double done_us = 0;     // the backend completed it (noticed_us when it does not say)
  double noticed_us = 0;  // the engine's worker saw it complete
  // Its window slot freed: on the thread that completed it, or when the
  // worker saw it complete (Note [Freeing a slot where the collective
  // completes]).
  double freed_us = 0;
  double copied_us = 0;   // copied back to the gradients, after the launches its
                          // freed window slot admitted (Note [Launch order])
  // Launched on the thread that completed an earlier collective (Note
  // [Freeing a slot where the collective completes]).
  bool on_completion = false;
};

struct IterationStats {
  int64_t iteration = 0;
  double start_us = 0;         // StartIteration(), else the first MarkReady
  // The next iteration's StartIteration (0 until it is called): the whole
  // iteration is start to next start (forward, backward, optimizer, ...).
  double next_start_us = 0;
  double backward_end_us = 0;  // the last MarkReady
  double finish_us = 0;        // Finish() returned
  double comm_us = 0;          // sum over buckets of launch -> completion
  double copy_in_us = 0;       // time spent copying into fusion buffers
  double copy_back_us = 0;     // time spent copying results back
  int buckets = 0;
  std::vector<int> launch_order;  // bucket indices in the order they were issued
  // Launches made on the thread that completed a collective, when its freed
  // window slot admitted them and no later collective was still queued
  // (Note [Freeing a slot where the collective completes]); the rest were
  // made by MarkReady's caller or the worker.
  int launches_on_completion = 0;
  // With EngineOptions::record_ready_times: per tensor, when MarkReady was
  // called, microseconds after start_us (so 0 for the first gradient when
  // StartIteration was not called).
  std::vector<double> ready_us;
  // Per launched bucket, in completion order: launch to the backend starting
  // it (comm::Work::started_ns), for backends that mark starts.
  std::vector<double> start_delay_us;
  // The same less the time spent queueing behind the previous collective:
  // from the later of the launch and that collective's completion to the
  // start (the executor's reaction: a wake-up, a hand-off).
  std::vector<double> start_reaction_us;
  // Every bucket, in launch order (the order the worker completes them).
  std::vector<BucketTiming> bucket_times;
  double backward_us() const { return backward_end_us - start_us; }
  double exposed_comm_us() const { return finish_us - backward_end_us; }
  double iteration_us() const { return finish_us - start_us; }
  // Start to next start once known, else start to Finish.
  double whole_us() const { return next_start_us > 0 ? next_start_us - start_us : iteration_us(); }
};

class Engine {
 public:
  // Validates the plan against the layout, allocates fusion buffers and
  // (with verify_across_ranks) checks agreement with the other ranks. Device
  // tensors need EngineOptions::device and a host communicator (staged:
  // Note [Device gradients over a host communicator]) or a device
  // communicator (Note [A device communicator]), whose device the engine
  // then uses (EngineOptions::device, if set, must be it). The communicator
  // must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(comm::Communicator& comm,
                                                        GradientLayout layout, Plan plan,
                                                        EngineOptions options = {});
  // Waits (up to options.timeout) for launched collectives; buffers still in
  // use by a collective that never completes are released only when the
  // communicator completes or fails it.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const GradientLayout& layout() const { return layout_; }
  const Plan& plan() const { return plan_; }
  uint64_t plan_hash() const { return plan_hash_; }

  // Where tensor `id` lives in its bucket's fusion buffer when it is not
  // split (see Note [Fusion buffers and views]); nullptr for split or
  // zero-size tensors. Stable until SetPlan.
  void* TensorStorage(int id) const;

  // Attaches the policy consulted between iterations (Note [The loop owns,
  // the policy advises] in policy.h); null removes it. Not during an
  // iteration.
  void SetPolicy(std::unique_ptr<PlanPolicy> policy);
  PlanPolicy* policy() const { return policy_.get(); }

  // Starts an iteration (call it where the training step starts: forward).
  // Closes the previous iteration's whole time, consults the policy and
  // installs the plan it returns (collective when a policy is set: every
  // rank calls it at the same iteration). Without a call, the first
  // MarkReady starts the iteration and no policy is consulted. A no-op when
  // the iteration has already started. Errors: the policy's, or SetPlan's.
  absl::Status StartIteration();

  // Gradient `id` (numel elements at `grad`, the layout's dtype) is ready.
  // Copies it into its bucket(s) on the calling thread and launches every
  // bucket that this completes, in plan order. Any thread, concurrently.
  // Errors (nothing is marked): an id not in the layout, a size that
  // differs from the layout, a tensor already marked this iteration, a
  // failed engine.
  absl::Status MarkReady(int id, void* grad, int64_t numel);

  // With options.device or a device communicator: gradient `id` (numel
  // elements of device memory at `grad`) will be complete once `ready` is
  // (an event recorded on the stream that computes it; null: it is complete
  // now). Enqueues its copy into the fusion buffer behind that event (host
  // staging, or device memory: none when `grad` is TensorStorage(id)) and
  // returns without waiting; the result is copied back to `grad`, which
  // must stay valid until finished_event() of this iteration is done. Any
  // thread. Errors as MarkReady's, and the device's.
  absl::Status MarkReadyOnDevice(int id, void* grad, int64_t numel,
                                 const comm::DeviceEvent* ready);

  // With device gradients, after Finish(): done once every gradient holds
  // its result in device memory; the consumer's stream waits on it
  // (WaitEvent). Null before the first Finish and for host gradients.
  std::shared_ptr<comm::DeviceEvent> finished_event() const;
  // OK, or why EngineOptions::worker_nice / worker_slice were not applied
  // (OK also until the worker has started).
  absl::Status worker_scheduling() const;

  // With options.external_buffers: every tensor of `bucket` is ready, packed
  // in the plan's slice order at `data` (numel elements, the bucket's
  // dtype). The allreduce runs in place there; `data` must stay valid and
  // untouched until on_bucket_reduced(bucket, ...). Launches in plan order.
  absl::Status MarkBucketReady(int bucket, void* data, int64_t numel);

  // Returns once every bucket is reduced and copied back, then readies the
  // engine for the next iteration. Deadline: options.timeout; the error
  // names the gradients never marked, or the buckets not reduced. Any error
  // during the iteration fails the engine: later calls return it.
  absl::Status Finish();

  // Replaces the plan between iterations (not while one is in progress):
  // validated, buffers reallocated, agreement checked as at Create.
  absl::Status SetPlan(Plan plan);

  // Statistics of completed iterations, oldest first.
  std::vector<IterationStats> stats() const;
  // The latest completed iteration's (a default IterationStats before the
  // first); cheaper than stats().back().
  IterationStats last_stats() const;
  // The engine's clock: microseconds since it was created.
  double NowUs() const;
  // Non-null when options.record_timeline.
  Timeline* timeline() { return timeline_.get(); }

 private:
  struct Launched {
    int bucket;
    int index;  // k: this iteration's k-th launch
    std::shared_ptr<comm::Work> work;
    // Set once on_bucket_reduced has returned for it (external buffers).
    std::shared_ptr<std::atomic<bool>> reported;
  };

  Engine(comm::Communicator& comm, GradientLayout layout, EngineOptions options);
  absl::Status Install(Plan plan);
  absl::Status VerifyAcrossRanks();
  // AllGather of two hashes per rank into `all` (staged through device
  // memory with a device communicator); waits up to options_.timeout.
  absl::Status GatherHashes(const int64_t (&mine)[2], std::vector<int64_t>& all);
  void ResetIterationLocked();
  void LaunchReadyLocked();
  void Launch(int bucket);  // under mu_: order_.Next()
  void WorkerLoop();
  absl::Status CopyBack(int bucket);
  // Shared by MarkReady and MarkReadyOnDevice: the id, size and pointer.
  absl::Status CheckMark(int id, const void* grad, int64_t numel) const;
  // Records that tensor `id` (its gradient at `grad`) was marked at `now`;
  // errors on a failed engine or a second mark. Under mu_.
  absl::Status MarkTensorLocked(int id, void* grad, double now);
  // Counts tensor `id`'s slices in (copied into their buckets at `at_us`)
  // and launches what that completes; under mu_.
  void SlicesInLocked(int id, double at_us);
  void FailLocked(absl::Status status);
  std::string DescribeMissingLocked() const;

  comm::Communicator& comm_;
  const GradientLayout layout_;
  const EngineOptions options_;
  // Note [A device communicator]: the communicator reduces device memory.
  const bool direct_;
  // Where the gradients live: options_.device, or the device
  // communicator's device; null for host gradients.
  comm::Device* const device_;
  const std::chrono::steady_clock::time_point epoch_;
  const int64_t epoch_ns_;  // epoch_ as comm::Work::SteadyNowNs() counts
  int64_t previous_completed_ns_ = 0;  // worker only: the last collective's completion
  std::unique_ptr<Timeline> timeline_;
  // With options_.device (Note [Device gradients over a host communicator]).
  std::unique_ptr<comm::DeviceStream> copy_in_;   // enqueued under device_mu_
  std::unique_ptr<comm::DeviceStream> copy_out_;  // the worker's, and Finish's
  std::mutex device_mu_;  // one tensor's copies-in enqueued together
  std::shared_ptr<comm::DeviceEvent> finished_;  // guarded by mu_

  // Fixed per plan (changed only by SetPlan while idle).
  Plan plan_;
  uint64_t plan_hash_ = 0;
  std::vector<std::vector<Placement>> placements_;  // per tensor
  std::vector<int> slices_per_bucket_;
  int vote_slots_ = 0;          // vote elements after each bucket's data
  std::shared_ptr<FusionBuffers> buffers_;  // shared with in-flight collectives
  std::deque<std::pair<uint64_t, std::shared_ptr<FusionBuffers>>> retained_;  // by plan hash
  std::vector<void*> storage_;  // per tensor, see TensorStorage
  std::unique_ptr<PlanPolicy> policy_;

  mutable std::mutex mu_;
  std::condition_variable cv_;  // worker queue, bucket completion
  // Per iteration, guarded by mu_.
  int64_t iteration_ = 0;
  std::vector<uint8_t> marked_;       // per tensor
  std::vector<void*> grads_;          // per tensor: where to write the result
  std::vector<char*> external_;       // per bucket: the caller's memory (external_buffers)
  std::vector<int> pending_slices_;   // per bucket
  // Per tensor: slices not yet copied back. Written only by the worker
  // during an iteration (reset under mu_ once every bucket is done).
  std::vector<int> pending_tensor_slices_;
  // Which bucket launches next (Note [Launch order]): made per plan, reset
  // per iteration; told of every bucket complete here, launch, freed slot
  // and votes.
  LaunchOrder order_;
  std::vector<char> done_;            // per bucket: reduced and copied back
  std::vector<double> launch_us_;     // per bucket
  std::vector<double> ready_at_us_;   // per bucket: when its last slice was marked
  std::vector<double> freed_at_us_;   // per bucket: when its window slot freed (0: not yet)
  std::vector<char> on_completion_;   // per bucket: launched by a completion callback
  int last_issued_index_ = -1;        // the last launch handed to the communicator
  int marked_count_ = 0;
  int in_flight_ = 0;                 // launched and not yet copied back
  // Note [Freeing a slot where the collective completes]: the iteration's
  // number, which a late completion of an earlier iteration does not match.
  // (Which launches' slots are free, a prefix of the launch order, and the
  // window they make, order_ keeps.)
  int64_t generation_ = 0;
  int done_count_ = 0;
  bool started_ = false;
  IterationStats current_;
  std::deque<Launched> launched_;     // for the worker, in launch order
  absl::Status failed_;               // sticky
  bool stopping_ = false;
  std::deque<IterationStats> history_;

  // Note [Freeing a slot where the collective completes]: how a Work's
  // completion callback reaches the engine, cleared (under its own mutex)
  // when the engine is destroyed.
  struct CompletionGate {
    std::mutex mu;
    Engine* engine = nullptr;
  };
  std::shared_ptr<CompletionGate> gate_ = std::make_shared<CompletionGate>();
  // The callback's side (on the thread that completed launch `index`):
  // frees its slot, where mu_ is free, and launches what that admits where
  // no later launch is still outstanding.
  void OnLaunchComplete(int64_t generation, int index, int bucket);
  // Frees launch `index`'s window slot if it is the next to free (mu_
  // held), with its votes where `read_votes`; false if it was freed before.
  bool FreeSlotLocked(int index, int bucket, bool read_votes);

  std::thread worker_;
  absl::Status worker_scheduling_;  // guarded by mu_
};

}  // namespace fusebox::bucketing

#endif  // FUSEBOX_BUCKETING_ENGINE_H_
