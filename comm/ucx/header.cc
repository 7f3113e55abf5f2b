#include "comm/ucx/header.h"

#include "absl/strings/str_cat.h"
#include "comm/types.h"

namespace fusebox::comm::ucx {

std::string Describe(const Header& h) {
  const auto k = static_cast<CollectiveKind>(h.kind);
  std::string s = absl::StrCat(CollectiveKindName(k), "(count=", h.count);
  if (k != CollectiveKind::kBarrier) {
    absl::StrAppend(&s, ", type=", DataTypeName(static_cast<DataType>(h.type)));
  }
  if (k == CollectiveKind::kAllReduce) {
    absl::StrAppend(&s, ", op=", ReduceOpName(static_cast<ReduceOp>(h.op)));
  }
  if (k == CollectiveKind::kBroadcast) absl::StrAppend(&s, ", root=", h.root);
  absl::StrAppend(&s, ", seq=", h.seq, ")");
  return s;
}

bool SameCall(const Header& a, const Header& b) {
  return a.kind == b.kind && a.type == b.type && a.op == b.op && a.root == b.root &&
         a.count == b.count && a.seq == b.seq;
}

}  // namespace fusebox::comm::ucx
