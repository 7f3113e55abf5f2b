// One UCX algorithm as a unit: what it is called, the byte ranges and world
// sizes it serves (its rows of the algorithm table), whether the measured
// choice may try it, and how it runs on a Context. Every unit lives in a
// file of its own under comm/ucx/algo/ and is listed once in registry.cc;
// BuildAlgorithmTable (comm/ucx/algorithms.h) builds the table from the
// list alone.
//
// Note [Algorithm units]
// As UCC's score maps do, each unit says for the table's inputs which bytes
// of which kind it serves and with what score; the table takes, for every
// size, the unit of the highest score that serves it (the scores of units
// serving the same size differ; registry_test checks it), and merges
// neighbours that name the same unit. A unit's data moves in one of three
// ways:
// * after a clean opening round (run): ring, chain, ring allgather, the
//   shared-memory allreduce, the local copy;
// * riding in the header round on one host (payload, then run reads every
//   rank's): one-shot;
// * inside the opening round over messages (open, which then is the whole
//   collective): recursive doubling and Rabenseifner in the descriptor
//   round, the linear allreduce in the linear round.
// A unit with neither open nor run is the opening round alone (Barrier).
#ifndef FUSEBOX_COMM_UCX_ALGO_UNIT_H_
#define FUSEBOX_COMM_UCX_ALGO_UNIT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "comm/ucx/algo/context.h"
#include "comm/ucx/algorithms.h"

namespace fusebox::comm::ucx {

// The table's inputs, with what follows from them alone.
struct Situation {
  explicit Situation(const AlgorithmInputs& inputs);

  const AlgorithmInputs& in;
  size_t small_bytes;  // SmallMessageBytes(in)
  // The descriptor (or linear) round opens collectives: several ranks and
  // no shared-memory exchange.
  bool messages;
  // The linear round opens them instead (Note [Linear round]).
  bool linear;
  // A power of two of at least 4 ranks (Rabenseifner's worlds).
  bool halving_world;
};

// Bytes lo..hi (inclusive) of `kind`, served with `score` (higher wins).
struct Served {
  Kind kind;
  size_t lo;
  size_t hi;
  int score;
};

// Where a unit's data rides when the opening round over messages carries it.
enum class Carrier : uint8_t {
  kNone,             // not carried in an opening round
  kDescriptorRound,  // counts toward AlgorithmTable::carried_bytes
  kLinearRound,
};

struct AlgorithmUnit {
  Algorithm algorithm;
  const char* name;  // AlgorithmName
  // The ranges it serves for these inputs (none: it does not serve them).
  std::vector<Served> (*serves)(const Situation&);
  // Whether the measured class (lo, hi] of AllReduce may try it (null:
  // never), and its place among a class's candidates (lower first: Note
  // [Measured choice], the trial's order).
  bool (*measured)(const Situation&, size_t lo, size_t hi);
  int trial_order;
  Carrier carrier;
  // Over messages: the opening round carrying the whole collective (null:
  // the plain opening round, then run).
  absl::Status (*open)(Context&, const Request&);
  // On one host: what rides in the header round (null: the header alone).
  HeaderPayload (*payload)(const Request&, int rank);
  // After a clean opening round (null: nothing more).
  absl::Status (*run)(Context&, const Request&);
};

// Every size of `kind` with `score`, in worlds of at least 2 ranks (none
// otherwise): the large algorithms of their kind.
inline std::vector<Served> EverySizeFromTwoRanks(const Situation& s, Kind kind, int score) {
  if (s.in.world < 2) return {};
  return {{kind, 0, SIZE_MAX, score}};
}

// Scores (Note [Algorithm units]): a unit that serves fewer sizes where it
// serves beats one that serves more.
inline constexpr int kScoreOpeningOnly = 0;
// The large algorithm of its kind: ring allreduce, chain broadcast, ring allgather.
inline constexpr int kScoreLarge = 10;
inline constexpr int kScoreShm = 20;
inline constexpr int kScoreLocal = 30;
inline constexpr int kScoreRecursiveDoubling = 40;
inline constexpr int kScoreRabenseifner = 50;
inline constexpr int kScoreLinear = 60;
inline constexpr int kScoreOneShot = 70;

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_ALGO_UNIT_H_
