// The UCX backend's choice of algorithm. See choice.h.
#include "comm/ucx/choice.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace fusebox::comm::ucx {

AlgorithmInputs TableInputs(const UcxOptions& options, int world, unsigned cores,
                            bool machine_oversubscribed) {
  AlgorithmInputs inputs;
  inputs.world = world;
  inputs.cores = cores;
  inputs.small_message_bytes = options.small_message_bytes;
  inputs.recursive_doubling_bytes = options.recursive_doubling_bytes;
  inputs.rabenseifner_bytes = options.rabenseifner_bytes;
  inputs.rabenseifner_from_bytes = options.rabenseifner_from_bytes;
  inputs.opening = options.opening;
  inputs.linear_bytes = options.linear_bytes;
  inputs.machine_oversubscribed = machine_oversubscribed;
  inputs.measured_bytes = options.measured_choice_bytes;
  inputs.shm_exchange = true;
  return inputs;
}

void AlgorithmChoice::Init(const AlgorithmInputs& inputs, int rank) {
  table_ = BuildAlgorithmTable(inputs);
  measured_.emplace(table_.measured(), /*decides=*/rank == 0);
  rank_zero_ = rank == 0;
}

AlgorithmChoice::Made AlgorithmChoice::Choose(Kind kind, size_t bytes) {
  Made m;
  m.algorithm = table_.Select(kind, bytes);
  // Note [Measured choice]: in a measured class, the trial's candidate or
  // the one chosen.
  if (kind == Kind::kAllReduce) m.pick = measured_->Next(bytes);
  if (m.pick.has_value()) m.algorithm = m.pick->algorithm;
  // Only rank 0 times (and only where classes are measured).
  m.timed = rank_zero_ && measuring();
  if (m.timed) m.began = absl::Now();
  return m;
}

void AlgorithmChoice::Record(const Made& m) {
  if (m.timed) measured_->Record(m.pick, m.began, absl::Now());
}

absl::Status AlgorithmChoice::Apply(uint8_t pad) {
  absl::Status s = measured_->Apply(pad);
  const std::string chosen = measured_->Describe();
  absl::MutexLock lock(&chosen_mu_);
  chosen_ = chosen;
  return s;
}

std::string AlgorithmChoice::Describe() const {
  std::string text = table_.Describe();
  absl::MutexLock lock(&chosen_mu_);
  if (!chosen_.empty()) {
    absl::StrAppend(&text, "\nChosen: ", absl::StrReplaceAll(chosen_, {{"\n", "; "}}));
  }
  return text;
}

}  // namespace fusebox::comm::ucx
