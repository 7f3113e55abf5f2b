#include "tests/soak/cache_round.h"

#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "fusebox/config.h"
#include "tests/soak/await.h"
#include "tests/soak/plan_mix.h"

namespace fusebox::soak {
namespace {

constexpr uint64_t kCacheStream = 0xcace;

// What `writer` stores in `round`, under the shared key or its own: a plan
// and figures of its own, rebuilt identically by every rank for checking.
absl::StatusOr<autotune::CacheEntry> EntryOf(const comm::Communicator& comm,
                                             const bucketing::GradientLayout& layout,
                                             const CacheRoundOptions& o, int writer,
                                             bool shared) {
  autotune::CacheEntry e;
  e.key.model_signature = autotune::ModelSignature(layout);
  e.key.world_size = comm.size();
  e.key.ranks_per_node = 1;
  e.key.backend = comm.backend();
  e.key.network = shared ? "soak-shared" : absl::StrCat("soak-rank", writer);
  e.model = "soak";
  e.layout_hash = layout.Hash();
  auto plan = PlanFromSeed(layout, Mix({o.seed, kCacheStream, static_cast<uint64_t>(o.round),
                                        static_cast<uint64_t>(writer), shared ? 1u : 0u}));
  if (!plan.ok()) return plan.status();
  e.plan = *std::move(plan);
  e.measured_iteration_us = 1000.25 * (writer + 1) + static_cast<double>(o.round);
  e.ddp_iteration_us = 2000.5;
  e.predicted_iteration_us = 0.125 * static_cast<double>(o.round);
  e.tuning_iterations = static_cast<int>(o.round % 1000000);
  e.cost_model = absl::StrCat("soak round ", o.round, " writer ", writer);
  e.fusebox_version = FUSEBOX_VERSION;
  e.created_unix_s = o.round;
  return e;
}

absl::Status Mismatch(const autotune::CacheKey& key, const std::string& what) {
  return absl::DataLossError(absl::StrCat("policy cache: entry ", key.FileName(), ": ", what));
}

// The temporary files a write leaves behind if it is interrupted
// (PolicyCache writes "<entry>.tmp.<pid>" and renames it).
absl::Status CheckDirectory(const std::string& dir, int expected_entries) {
  std::error_code ec;
  std::vector<std::string> temporaries;
  int entries = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = f.path().filename().string();
    if (absl::StrContains(name, ".tmp")) temporaries.push_back(name);
    if (absl::EndsWith(name, ".json")) ++entries;
  }
  if (ec) return absl::UnavailableError(absl::StrCat("listing ", dir, ": ", ec.message()));
  if (!temporaries.empty()) {
    return absl::DataLossError(absl::StrCat("policy cache: temporary files left in ", dir, ": ",
                                            absl::StrJoin(temporaries, ", ")));
  }
  if (expected_entries >= 0 && entries != expected_entries) {
    return absl::DataLossError(absl::StrCat("policy cache: ", dir, " holds ", entries,
                                            " entries, want ", expected_entries));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bucketing::Plan> RunCacheRound(autotune::PolicyCache& cache,
                                              std::vector<std::string>& warnings,
                                              comm::Communicator& comm,
                                              const bucketing::GradientLayout& layout,
                                              const CacheRoundOptions& options,
                                              CacheRoundCounts& counts) {
  const int world = comm.size();
  std::vector<autotune::CacheEntry> shared, own;
  for (int r = 0; r < world; ++r) {
    auto s = EntryOf(comm, layout, options, r, /*shared=*/true);
    if (!s.ok()) return s.status();
    shared.push_back(*std::move(s));
    auto o = EntryOf(comm, layout, options, r, /*shared=*/false);
    if (!o.ok()) return o.status();
    own.push_back(*std::move(o));
  }
  const int rank = comm.rank();
  for (const autotune::CacheEntry* e : {&shared[rank], &own[rank]}) {
    if (absl::Status s = cache.Store(*e); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("policy cache: storing ", e->key.FileName(),
                                                 ": ", s.message()));
    }
    ++counts.writes;
  }
  absl::Status s = Await(comm.Barrier(), options.timeout, "barrier after the cache writes");
  if (!s.ok()) return s;

  // The shared key: one writer's entry, whole.
  std::optional<autotune::CacheEntry> won = cache.Lookup(shared[0].key, layout);
  ++counts.reads;
  if (!won) return Mismatch(shared[0].key, "Lookup missed after every rank stored it");
  const std::string text = autotune::SerializeCacheEntry(*won);
  bool matched = false;
  for (const autotune::CacheEntry& e : shared) matched |= autotune::SerializeCacheEntry(e) == text;
  if (!matched) {
    return Mismatch(shared[0].key, absl::StrCat("reads back as no rank's write:\n", text));
  }
  // Every rank's own key, directly and as the nearest world size.
  for (int r = 0; r < world; ++r) {
    const std::string want = autotune::SerializeCacheEntry(own[r]);
    std::optional<autotune::CacheEntry> got = cache.Lookup(own[r].key, layout);
    autotune::CacheKey twice = own[r].key;
    twice.world_size = 2 * world;
    std::optional<autotune::CacheEntry> nearest = cache.Nearest(twice, layout);
    counts.reads += 2;
    if (!got || autotune::SerializeCacheEntry(*got) != want) {
      return Mismatch(own[r].key, absl::StrCat("Lookup returned ",
                                               got ? autotune::SerializeCacheEntry(*got) : "nothing",
                                               "\nwant (rank ", r, "'s write):\n", want));
    }
    if (!nearest || autotune::SerializeCacheEntry(*nearest) != want) {
      return Mismatch(own[r].key, absl::StrCat("Nearest(world ", 2 * world, ") returned ",
                                               nearest ? nearest->key.FileName() : "nothing"));
    }
  }
  for (const autotune::ListedEntry& listed : cache.List()) {
    if (!listed.status.ok()) {
      return absl::DataLossError(absl::StrCat("policy cache: List() finds ", listed.file,
                                              " unusable: ", listed.status.message()));
    }
  }
  ++counts.reads;
  s = CheckDirectory(cache.dir(), options.exclusive_dir ? world + 1 : -1);
  if (s.ok() && !warnings.empty()) {
    s = absl::DataLossError(absl::StrCat("policy cache warned: ", absl::StrJoin(warnings, "; ")));
  }
  if (!s.ok()) return s;
  return won->plan;
}

}  // namespace fusebox::soak
