#include "comm/ucx/algo/context.h"

namespace fusebox::comm::ucx {

absl::Status FinishSends(Channel& channel, absl::Status first, std::deque<Pending>* sends,
                         std::vector<Pending>* recvs, const char* send_what) {
  for (Pending& s : *sends) {
    if (!first.ok()) break;
    first = channel.Finish(&s, send_what);
  }
  if (!first.ok()) {
    for (Pending& r : *recvs) channel.Release(&r, /*is_recv=*/true);
    for (Pending& snd : *sends) channel.Release(&snd, /*is_recv=*/false);
  }
  return first;
}

}  // namespace fusebox::comm::ucx
