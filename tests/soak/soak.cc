#include "tests/soak/soak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "autotune/policy_cache.h"
#include "bucketing/engine.h"
#include "comm/testing/exact_data.h"
#include "tests/soak/await.h"
#include "tests/soak/cache_round.h"
#include "tests/soak/gradient_tapes.h"
#include "tests/soak/plan_mix.h"

namespace fusebox::soak {
namespace {

using bucketing::Engine;
using bucketing::GradientLayout;
using bucketing::Plan;
using bucketing::Schedule;
using bucketing::TensorSpec;
using comm::DataType;
using comm::ReduceOp;
using Clock = std::chrono::steady_clock;

// Seed streams, so that plans, engines, orders and direct calls draw
// independently from one --seed.
constexpr uint64_t kLayoutStream = 0x1a40;
constexpr uint64_t kPlanStream = 0x91a7;
constexpr uint64_t kEngineStream = 0xe791;
constexpr uint64_t kOrderStream = 0x0dde;
constexpr uint64_t kDirectStream = 0xd17e;
constexpr size_t kMaxMismatchesKept = 4;

int64_t Bytes(int64_t count, DataType type) {
  return count * static_cast<int64_t>(comm::DataTypeSize(type));
}

// Collectives the engine issues per iteration: one per bucket, except a
// bucket of zero-size tensors only, unless it carries the priority votes
// (Engine::Launch).
int64_t IssuedBuckets(const Plan& plan, Schedule schedule) {
  int64_t n = 0;
  for (const bucketing::Bucket& b : plan.buckets) {
    n += b.count() > 0 || schedule == Schedule::kForwardPriority;
  }
  return n;
}

// "3 of 1200 elements differ, first at [17]: got 1.5, want 1.25"
std::string DescribeDifference(const void* got, const void* want, int64_t count, DataType type) {
  const size_t wrong = comm::testing::CountMismatches(got, want, count, type);
  const size_t esize = comm::DataTypeSize(type);
  int64_t first = 0;
  while (first < count && std::memcmp(static_cast<const char*>(got) + first * esize,
                                      static_cast<const char*>(want) + first * esize, esize) == 0) {
    ++first;
  }
  return absl::StrFormat("%d of %d %s elements differ, first at [%d]: got %g, want %g", wrong,
                         count, comm::DataTypeName(type), first,
                         comm::testing::LoadElement(got, first, type),
                         comm::testing::LoadElement(want, first, type));
}

// The cache in `options.cache_dir`, its warnings collected in `warnings`
// (which must outlive it): a warning is a failure of the round.
autotune::PolicyCacheOptions CacheOptions(const SoakOptions& options,
                                          std::vector<std::string>& warnings) {
  autotune::PolicyCacheOptions o;
  o.dir = options.cache_dir;
  o.warn = [&warnings](const std::string& w) { warnings.push_back(w); };
  o.lock_timeout = options.timeout;
  return o;
}

// One tensor of a direct call: its input (and, out of place, its output).
struct DirectTensor {
  DataType type = DataType::kFloat32;
  int64_t count = 0;
  uint64_t seed = 0;
  std::vector<unsigned char> send, recv;
};

struct DirectCall {
  ReduceOp op = ReduceOp::kSum;
  bool in_place = true;
  std::vector<DirectTensor> tensors;
  absl::StatusOr<std::shared_ptr<comm::Work>> issued;
};

class Soak {
 public:
  Soak(comm::Communicator& comm, const SoakOptions& options, GradientLayout layout)
      : comm_(comm),
        options_(options),
        layout_(std::move(layout)),
        tapes_(layout_, comm.rank(), comm.size()),
        cache_(CacheOptions(options, warnings_)),
        grads_(layout_.size()),
        where_(layout_.size()),
        order_(layout_.size()) {
    for (int id = 0; id < layout_.size(); ++id) {
      const TensorSpec& t = layout_.tensor(id);
      grads_[id].resize(std::max<int64_t>(1, Bytes(t.numel, t.dtype)));
    }
  }

  absl::StatusOr<SoakReport> Run();

 private:
  absl::Status Rebuild(int64_t index);
  absl::Status Install(absl::StatusOr<Plan> plan);
  absl::Status Backward(int64_t it);
  absl::Status Direct(int64_t it);
  absl::StatusOr<bool> Vote(int64_t it, bool want_stop);
  absl::Status CheckCountsAgree();
  bool InWarmup(int64_t it, double elapsed_s) const;
  void RecordMismatch(std::string what);
  std::string Where(int64_t it) const {
    return absl::StrCat("iteration ", it, ", plan \"", engine_->plan().name, "\"");
  }

  comm::Communicator& comm_;
  const SoakOptions options_;
  const GradientLayout layout_;
  GradientTapes tapes_;
  std::vector<std::string> warnings_;  // from the cache's warn sink
  autotune::PolicyCache cache_;
  std::unique_ptr<Engine> engine_;
  Schedule schedule_ = Schedule::kPlanOrder;
  int64_t issued_per_iteration_ = 0;
  std::vector<std::vector<unsigned char>> grads_;  // per tensor, when not a view
  std::vector<void*> where_;                       // per tensor, this iteration
  std::vector<int> order_;                         // marking order, this iteration
  std::vector<std::string> mismatches_;            // this iteration's, first few
  size_t mismatch_count_ = 0;
  std::vector<std::unique_ptr<char[]>> leaked_;    // --leak_kib
  SoakCounts counts_;
  UsageWatch usage_;
};

absl::Status Soak::Rebuild(int64_t index) {
  std::mt19937_64 rng(Mix({options_.seed, kEngineStream, static_cast<uint64_t>(index)}));
  bucketing::EngineOptions eo;
  eo.schedule = rng() % 2 == 0 ? Schedule::kPlanOrder : Schedule::kForwardPriority;
  eo.max_in_flight = 1 << (rng() % 4);
  eo.average = index % 2 == 0;
  eo.timeout = options_.timeout;
  // A short statistics history, so that its growth up to the bound (4096
  // iterations by default) does not read as a leak.
  eo.stats_history = 16;
  auto plan = PlanFromSeed(layout_, rng());
  if (!plan.ok()) return plan.status();
  engine_.reset();  // one engine's fusion buffers at a time
  auto engine = Engine::Create(comm_, layout_, *plan, eo);
  if (!engine.ok()) {
    return absl::Status(engine.status().code(), absl::StrCat("engine ", index, " (plan \"",
                                                             plan->name, "\"): ",
                                                             engine.status().message()));
  }
  engine_ = *std::move(engine);
  schedule_ = eo.schedule;
  issued_per_iteration_ = IssuedBuckets(engine_->plan(), schedule_);
  tapes_.SetAverage(eo.average);
  ++counts_.engine_rebuilds;
  return absl::OkStatus();
}

absl::Status Soak::Install(absl::StatusOr<Plan> plan) {
  if (!plan.ok()) return plan.status();
  const std::string name = plan->name;
  absl::Status s = engine_->SetPlan(*std::move(plan));
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("SetPlan(\"", name, "\"): ", s.message()));
  }
  issued_per_iteration_ = IssuedBuckets(engine_->plan(), schedule_);
  ++counts_.plan_swaps;
  return absl::OkStatus();
}

void Soak::RecordMismatch(std::string what) {
  if (mismatches_.size() < kMaxMismatchesKept) mismatches_.push_back(std::move(what));
  ++mismatch_count_;
}

// Fills every gradient from the tapes (in place in the fusion buffer for
// about half the tensors that have a view), marks them ready from several
// threads in a per-rank random order, finishes, and compares every result
// with the expected reduction.
absl::Status Soak::Backward(int64_t it) {
  Engine& engine = *engine_;
  const int n = layout_.size();
  for (int id = 0; id < n; ++id) {
    const TensorSpec& t = layout_.tensor(id);
    void* view = engine.TensorStorage(id);
    where_[id] = view != nullptr && (id + it) % 2 == 0 ? view : grads_[id].data();
    std::memcpy(where_[id], tapes_.Input(t.dtype, GradientTapes::Shift(it, id)),
                Bytes(t.numel, t.dtype));
  }
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(Mix({options_.seed, kOrderStream, static_cast<uint64_t>(it),
                           static_cast<uint64_t>(comm_.rank())}));
  std::shuffle(order_.begin(), order_.end(), rng);

  if (absl::Status s = engine.StartIteration(); !s.ok()) return s;
  std::atomic<size_t> next{0};
  std::mutex mu;
  absl::Status marking;
  auto mark = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order_.size();) {
      const int id = order_[k];
      absl::Status s = engine.MarkReady(id, where_[id], layout_.tensor(id).numel);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (marking.ok()) marking = absl::Status(s.code(), absl::StrCat("MarkReady(", id, "): ",
                                                                        s.message()));
      }
    }
  };
  std::vector<std::thread> helpers;
  for (int h = 1; h < options_.marking_threads; ++h) helpers.emplace_back(mark);
  mark();
  for (std::thread& h : helpers) h.join();
  absl::Status s = marking.ok() ? engine.Finish() : marking;
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(Where(it), ": ", s.message()));
  counts_.engine_allreduces += issued_per_iteration_;
  counts_.bytes_reduced += layout_.total_bytes();

  if (it == options_.corrupt_at && comm_.rank() == comm_.size() - 1) {
    for (int id = 0; id < n; ++id) {
      if (layout_.tensor(id).numel == 0) continue;
      static_cast<unsigned char*>(where_[id])[0] ^= 1;  // injected: the check must see it
      break;
    }
  }
  for (int id = 0; id < n; ++id) {
    const TensorSpec& t = layout_.tensor(id);
    const unsigned char* want = tapes_.Expected(t.dtype, GradientTapes::Shift(it, id));
    if (std::memcmp(where_[id], want, Bytes(t.numel, t.dtype)) == 0) continue;
    RecordMismatch(absl::StrCat(
        Where(it), ", ", tapes_.average() ? "average" : "sum", ": gradient ", id, " \"", t.name,
        "\" (", where_[id] == grads_[id].data() ? "copied in and out" : "in its fusion buffer",
        "): ", DescribeDifference(where_[id], want, t.numel, t.dtype)));
  }
  return absl::OkStatus();
}

// options_.direct_calls calls straight to the communicator, drawn from the
// seed and the iteration (the same on every rank): AllReduce in place or
// out of place, or AllReduceMulti of 2-4 tensors; every dtype and op; sizes
// from 0 to max_direct_elements. All are issued, then all awaited and
// checked (out of place: the input must be left untouched).
absl::Status Soak::Direct(int64_t it) {
  std::mt19937_64 rng(Mix({options_.seed, kDirectStream, static_cast<uint64_t>(it)}));
  const int rank = comm_.rank(), world = comm_.size();
  std::vector<DirectCall> calls(options_.direct_calls);
  for (DirectCall& call : calls) {
    call.op = comm::kAllReduceOps[rng() % comm::kNumReduceOps];
    // Products of the exact inputs stay exact over at most 7 ranks (exact_data.h).
    if (call.op == ReduceOp::kProd && world > 7) call.op = ReduceOp::kSum;
    const int ntensors = rng() % 4 == 0 ? 2 + static_cast<int>(rng() % 3) : 1;
    call.in_place = ntensors > 1 || rng() % 2 == 0;
    std::vector<comm::TensorRef> refs;
    for (int k = 0; k < ntensors; ++k) {
      DirectTensor t;
      t.type = comm::kAllDataTypes[rng() % comm::kNumDataTypes];
      t.count = rng() % 16 == 0 ? 0 : LogUniform(rng, 1, options_.max_direct_elements);
      t.seed = rng() % (1u << 20);
      const size_t bytes = std::max<int64_t>(1, Bytes(t.count, t.type));
      t.send.resize(bytes);
      comm::testing::FillInput(t.send.data(), t.count, t.type, call.op, rank, t.seed);
      if (!call.in_place) t.recv.assign(bytes, 0xa5);
      refs.push_back(comm::TensorRef{t.send.data(), static_cast<size_t>(t.count), t.type});
      call.tensors.push_back(std::move(t));
    }
    DirectTensor& t0 = call.tensors[0];
    call.issued = ntensors > 1 ? comm_.AllReduceMulti(refs, call.op)
                               : comm_.AllReduce(t0.send.data(),
                                                 call.in_place ? t0.send.data() : t0.recv.data(),
                                                 t0.count, t0.type, call.op);
  }
  std::vector<unsigned char> scratch;
  for (size_t j = 0; j < calls.size(); ++j) {
    DirectCall& call = calls[j];
    const std::string what = absl::StrCat(
        "iteration ", it, ": direct call ", j, " (", call.tensors.size() > 1 ? "AllReduceMulti" :
        call.in_place ? "AllReduce in place" : "AllReduce out of place", ", ",
        comm::ReduceOpName(call.op), ")");
    absl::Status s = Await(std::move(call.issued), options_.timeout, what);
    if (!s.ok()) return s;
    for (size_t k = 0; k < call.tensors.size(); ++k) {
      const DirectTensor& t = call.tensors[k];
      scratch.resize(t.send.size());
      comm::testing::FillExpected(scratch.data(), t.count, t.type, call.op, world, t.seed);
      const unsigned char* got = call.in_place ? t.send.data() : t.recv.data();
      if (std::memcmp(got, scratch.data(), Bytes(t.count, t.type)) != 0) {
        RecordMismatch(absl::StrCat(what, " tensor ", k, ": ",
                                    DescribeDifference(got, scratch.data(), t.count, t.type)));
      }
      if (!call.in_place) {
        comm::testing::FillInput(scratch.data(), t.count, t.type, call.op, rank, t.seed);
        if (std::memcmp(t.send.data(), scratch.data(), Bytes(t.count, t.type)) != 0) {
          RecordMismatch(absl::StrCat(what, ": the input changed: ",
                                      DescribeDifference(t.send.data(), scratch.data(), t.count,
                                                         t.type)));
        }
      }
      ++counts_.direct_allreduces;
      counts_.bytes_reduced += Bytes(t.count, t.type);
    }
  }
  return absl::OkStatus();
}

// Every rank says whether it wants to stop (its time is up) and whether it
// saw a wrong result; all stop together at the end of this iteration if any
// wants to or saw one.
absl::StatusOr<bool> Soak::Vote(int64_t it, bool want_stop) {
  const int world = comm_.size();
  std::vector<int32_t> votes(1 + world, 0);
  votes[0] = want_stop ? 1 : 0;
  votes[1 + comm_.rank()] = mismatch_count_ > 0 ? 1 : 0;
  absl::Status s = Await(comm_.AllReduce(votes.data(), votes.data(), votes.size(),
                                         DataType::kInt32, ReduceOp::kMax),
                         options_.timeout, absl::StrCat("iteration ", it, ": the stop vote"));
  if (!s.ok()) return s;
  ++counts_.vote_allreduces;
  if (mismatch_count_ > 0) {
    return absl::DataLossError(absl::StrCat(
        mismatch_count_, " wrong result(s) on rank ", comm_.rank(), "/", world, ": ",
        absl::StrJoin(mismatches_, "; "),
        mismatch_count_ > mismatches_.size() ? "; ..." : ""));
  }
  std::vector<int> failed;
  for (int r = 0; r < world; ++r) {
    if (votes[1 + r] != 0) failed.push_back(r);
  }
  if (!failed.empty()) {
    return absl::AbortedError(absl::StrCat("iteration ", it, ": rank(s) ",
                                           absl::StrJoin(failed, ", "),
                                           " found wrong results (see their messages); stopping"));
  }
  return votes[0] != 0;
}

// Every rank must have issued exactly the same collectives and cache
// operations.
absl::Status Soak::CheckCountsAgree() {
  const std::vector<int64_t> mine = {
      counts_.iterations,   counts_.engine_allreduces, counts_.direct_allreduces,
      counts_.plan_swaps,   counts_.engine_rebuilds,   counts_.cache_rounds,
      counts_.bytes_reduced};
  std::vector<int64_t> lo = mine, hi = mine;
  for (auto [buf, op] : {std::pair{&lo, ReduceOp::kMin}, std::pair{&hi, ReduceOp::kMax}}) {
    absl::Status s = Await(comm_.AllReduce(buf->data(), buf->data(), buf->size(),
                                           DataType::kInt64, op),
                           options_.timeout, "comparing the counts");
    if (!s.ok()) return s;
  }
  if (lo != hi) {
    return absl::InternalError(absl::StrCat(
        "the ranks disagree on the counts (iterations, engine allreduces, direct allreduces, "
        "plan swaps, engines, cache rounds, bytes): min [", absl::StrJoin(lo, ", "), "], max [",
        absl::StrJoin(hi, ", "), "]"));
  }
  return absl::OkStatus();
}

bool Soak::InWarmup(int64_t it, double elapsed_s) const {
  bool warm = true;
  if (options_.iterations > 0) {
    warm &= static_cast<double>(it + 1) <= options_.warmup_fraction * options_.iterations;
  }
  if (options_.seconds > 0) warm &= elapsed_s <= options_.warmup_fraction * options_.seconds;
  return warm;
}

absl::StatusOr<SoakReport> Soak::Run() {
  if (!cache_.writable()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the policy cache directory ", options_.cache_dir, " is not usable: ",
        absl::StrJoin(warnings_, "; ")));
  }
  const Clock::time_point start = Clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  for (int64_t it = 0;; ++it) {
    absl::Status s;
    const bool rebuild = options_.rebuild_every > 0 ? it % options_.rebuild_every == 0 : it == 0;
    if (rebuild) s = Rebuild(it / std::max(1, options_.rebuild_every));
    if (s.ok() && it > 0 && options_.cache_every > 0 && it % options_.cache_every == 0) {
      CacheRoundOptions co;
      co.seed = options_.seed;
      co.round = counts_.cache_rounds++;
      co.exclusive_dir = options_.exclusive_cache_dir;
      co.timeout = options_.timeout;
      CacheRoundCounts cc;
      absl::StatusOr<Plan> winner = RunCacheRound(cache_, warnings_, comm_, layout_, co, cc);
      counts_.cache_writes += cc.writes;
      counts_.cache_reads += cc.reads;
      s = winner.ok() ? Install(*std::move(winner))
                      : absl::Status(winner.status().code(),
                                     absl::StrCat("iteration ", it, ": ", winner.status().message()));
    } else if (s.ok() && !rebuild && options_.plan_every > 0 && it % options_.plan_every == 0) {
      s = Install(PlanFromSeed(layout_, Mix({options_.seed, kPlanStream, static_cast<uint64_t>(it)})));
    }
    if (s.ok()) s = Backward(it);
    if (s.ok()) s = Direct(it);
    if (!s.ok()) return s;
    if (options_.leak_kib_per_iteration > 0) {
      const size_t bytes = static_cast<size_t>(options_.leak_kib_per_iteration) << 10;
      leaked_.push_back(std::make_unique<char[]>(bytes));
      std::memset(leaked_.back().get(), 0x5a, bytes);
    }
    const double elapsed = elapsed_s();
    const bool want_stop = (options_.iterations > 0 && it + 1 >= options_.iterations) ||
                           (options_.seconds > 0 && elapsed >= options_.seconds);
    absl::StatusOr<bool> stop = Vote(it, want_stop);
    if (!stop.ok()) return stop.status();
    if ((it + 1) % std::max(1, options_.sample_every) == 0 || *stop) {
      absl::StatusOr<UsageSample> sample = SampleUsage(it + 1);
      if (!sample.ok()) return sample.status();
      const bool warmup = InWarmup(it, elapsed);
      usage_.Add(*sample, warmup);
      if (options_.log_samples) {
        std::printf("fusebox_soak rank %d sample %s%s: RSS %.1f MiB, %d fds, plan \"%s\" (%zu buckets)\n",
                    comm_.rank(), absl::StrCat(it + 1).c_str(), warmup ? " (warm-up)" : "",
                    sample->rss_bytes / 1048576.0, sample->fds, engine_->plan().name.c_str(),
                    engine_->plan().buckets.size());
        std::fflush(stdout);  // a pipe under fusebox-run: show it now
      }
    }
    if (*stop) {
      counts_.iterations = it + 1;
      break;
    }
  }
  SoakReport report;
  report.wall_seconds = elapsed_s();
  if (absl::Status s = CheckCountsAgree(); !s.ok()) return s;
  report.counts = counts_;
  report.usage = usage_;
  return report;
}

}  // namespace

absl::StatusOr<SoakReport> RunSoak(comm::Communicator& comm, const SoakOptions& options) {
  if (options.iterations <= 0 && options.seconds <= 0) {
    return absl::InvalidArgumentError("give an iteration count or a duration (or both)");
  }
  auto layout = MixedLayout(Mix({options.seed, kLayoutStream}), options.tensors,
                            options.max_tensor_bytes);
  if (!layout.ok()) return layout.status();
  Soak soak(comm, options, *std::move(layout));
  return soak.Run();
}

std::string SummaryLine(const comm::Communicator& comm, const SoakOptions& options,
                        const SoakReport& report) {
  const SoakCounts& c = report.counts;
  const UsageWatch& u = report.usage;
  constexpr double kMiB = 1 << 20;
  return absl::StrFormat(
      "rank %d/%d: %d iterations, %d allreduces (engine buckets %d, direct %d, votes %d), "
      "%d plan swaps, %d engines, cache %d writes / %d reads in %d rounds, %.2f GB reduced, "
      "RSS %.1f -> %.1f MiB (end-window median; bound +%.1f, peak %.1f), fds %d -> %d, %.1f s",
      comm.rank(), comm.size(), c.iterations, c.allreduces(), c.engine_allreduces,
      c.direct_allreduces, c.vote_allreduces, c.plan_swaps, c.engine_rebuilds, c.cache_writes,
      c.cache_reads, c.cache_rounds, c.bytes_reduced / 1e9, u.baseline().rss_bytes / kMiB,
      u.final_rss_bytes() / kMiB, u.Bound(options.rss_slack_bytes, options.rss_slack_fraction) / kMiB,
      std::max(u.peak_rss_bytes(), u.last().rss_bytes) / kMiB, u.baseline().fds, u.last().fds,
      report.wall_seconds);
}

}  // namespace fusebox::soak
