// What a rank can learn about its peers when a collective times out.
//
// Note [Timeout post-mortem]
// A collective that times out cannot tell from its own transport which rank
// is at fault: in a ring, rank r waits on rank r-1 whether r-1 died or is
// itself waiting on a dead rank. So every rank that gives up on a
// collective writes what it was doing under "<scope>/fault/<rank>" in the
// job's store and waits up to `grace` for the other ranks' reports. Ranks
// that report are alive (and stuck too: their reports say where); the rest
// are named as dead or stalled. This is PyTorch's monitored barrier done
// after the fact, so that it costs nothing while collectives succeed. It
// needs the store to be reachable: the launcher (fusebox-run) hosts it
// apart from the ranks; when rank 0 hosts it and rank 0 is the rank that
// died, the post-mortem says the store is unreachable instead. Where rank 0
// hosts it (under mpirun), rank 0 may also give up, finish its own
// post-mortem and exit while a later rank is still waiting for reports (a
// rank reaching the stuck collective more than the grace after rank 0 did,
// with 3 OpenMPI ranks busy-polling on 2 cores, made the killed rank go
// unnamed). So each rank, once it has its answer, marks
// "<scope>/fault/read/<rank>" and waits for that mark from every rank it saw
// report, for up to the longest grace any rank uses plus a second (a rank
// told of the failure by a peer waits 2 s where one that timed out waits
// 5-10 s, and the host may be either): the host stays until the ranks that
// were waiting with it have read what they waited for. It cannot wait for a rank
// that had not reported by the end of its own wait (a dead rank never
// would); for such a late rank, the reports already in are read before its
// wait, and a store that fails during it still leaves the ranks that had
// not reported until then named.
#ifndef FUSEBOX_COMM_FAULT_H_
#define FUSEBOX_COMM_FAULT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "comm/store.h"

namespace fusebox::comm {

// How long a timed-out rank waits for its peers' reports: a quarter of the
// collective timeout, within [5 s, 10 s] (ranks of a busy, oversubscribed
// host can reach the same stuck collective seconds apart). Ranks that entered the collective
// more than this apart may be named as silent. No rank of a communicator
// waits longer (a rank told of the failure by a peer waits less), so this
// plus a little is how long a rank stays for its peers to read the reports
// (PostMortemStay).
absl::Duration PostMortemGrace(absl::Duration collective_timeout);
absl::Duration PostMortemStay(absl::Duration collective_timeout);

// Publishes `doing` (e.g. "AllReduce(count=8, seq=3) waiting for rank 1")
// as this rank's report, gathers the others' for up to `grace` and returns
// one sentence for the error message, e.g.
//   "post-mortem: rank 1 did not report within 2s (dead or stalled); rank 2
//    reports: AllReduce(count=8, seq=3) waiting for rank 1"
// Never fails: a store error is described in the text. Only the first
// report of each rank under a scope counts; a communicator runs it once.
// Then stays until every rank that reported has read the reports too, or
// for at most `stay` (at least the longest grace any rank of the
// communicator uses: PostMortemStay).
std::string TimeoutPostMortem(Store& store, absl::string_view scope, int rank, int size,
                              absl::string_view doing, absl::Duration grace, absl::Duration stay);

}  // namespace fusebox::comm

#endif  // FUSEBOX_COMM_FAULT_H_
