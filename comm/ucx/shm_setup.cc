// The UCX backend's shared-memory segments. See shm_setup.h.
#include "comm/ucx/shm_setup.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "comm/ucx/header.h"

namespace fusebox::comm::ucx {
namespace {

// The largest header round that goes through shared-memory mailboxes (two
// per rank, in every rank's segment); above it, UCX messages.
constexpr size_t kMaxMailboxBytes = size_t{1} << 20;

// Allocates and maps this rank's segment of `bytes` and packs what a peer
// needs to map it ([u64 address][packed rkey]); on failure, *why says so.
std::string PackSegment(Channel& channel, size_t bytes, size_t chunk_bytes, size_t mailbox_bytes,
                        ShmSegments* segments, void** local, std::string* why) {
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  std::string mine;
  ucs_status_t st = ucp_mem_map(channel.context(), &mp, &segments->memh);
  if (st == UCS_OK) {
    ucp_mem_attr_t attr{};
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
    st = ucp_mem_query(segments->memh, &attr);
    *local = attr.address;
  }
  void* packed = nullptr;
  size_t packed_len = 0;
  if (st == UCS_OK) st = ucp_rkey_pack(channel.context(), segments->memh, &packed, &packed_len);
  if (st == UCS_OK) {
    // [u64 address][u64 pid][packed rkey]: the pid and the owner's own
    // address of its segment are what a peer's cross-memory probe reads.
    const uint64_t addr = reinterpret_cast<uintptr_t>(*local);
    const uint64_t pid = static_cast<uint64_t>(getpid());
    mine.assign(reinterpret_cast<const char*>(&addr), sizeof(addr));
    mine.append(reinterpret_cast<const char*>(&pid), sizeof(pid));
    mine.append(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    InitShmSegment(static_cast<unsigned char*>(*local), channel.size(), chunk_bytes,
                   mailbox_bytes);
    // A value of this segment's own, for the peers' cross-memory probe.
    SetShmProbeWord(static_cast<unsigned char*>(*local), addr ^ (pid << 40) ^ 0x9e3779b97f4a7c15);
  } else {
    *why = absl::StrCat("rank ", channel.rank(), ": ", UcsError(st));
  }
  return mine;
}

constexpr size_t kBlobHead = 2 * sizeof(uint64_t);  // address, pid

// Maps every peer's segment from what it published (`all`); on failure,
// *why says which.
void MapPeers(Channel& channel, const std::vector<std::string>& all, ShmGroup* group,
              ShmSegments* segments, std::string* why) {
  const int rank = channel.rank(), size = channel.size();
  for (int peer = 0; peer < size && why->empty(); ++peer) {
    if (peer == rank) continue;
    const std::string& blob = all[peer];
    if (blob.size() <= kBlobHead) {
      *why = absl::StrCat("rank ", peer, " has no shared segment");
      break;
    }
    uint64_t raddr;
    std::memcpy(&raddr, blob.data(), sizeof(raddr));
    ucs_status_t st =
        ucp_ep_rkey_unpack(channel.endpoint(peer), blob.data() + kBlobHead,
                           &segments->rkeys[peer]);
    void* ptr = nullptr;
    if (st == UCS_OK) st = ucp_rkey_ptr(segments->rkeys[peer], raddr, &ptr);
    if (st != UCS_OK) {
      *why = absl::StrCat("rank ", rank, " cannot map rank ", peer, "'s segment: ", UcsError(st));
      break;
    }
    group->bases[peer] = static_cast<unsigned char*>(ptr);
  }
}

// Note [Single-copy allreduce] in comm/ucx/shm_allreduce.h: whether this
// rank reads every peer's segment by cross-memory attach, in words that are
// the same on every rank that does ("cma ok").
std::string ProbePeers(const std::vector<std::string>& all, const ShmGroup& group, int rank,
                       bool wanted) {
  if (!wanted) return absl::StrCat("cma off on rank ", rank);
  for (size_t peer = 0; peer < all.size(); ++peer) {
    if (static_cast<int>(peer) == rank) continue;
    if (all[peer].size() < kBlobHead) return absl::StrCat("cma: rank ", peer, " sent no pid");
    uint64_t addr, pid;
    std::memcpy(&addr, all[peer].data(), sizeof(addr));
    std::memcpy(&pid, all[peer].data() + sizeof(addr), sizeof(pid));
    // The peer's probe word as this rank's mapping shows it, and as the
    // kernel reads it at the peer's own address.
    const uint64_t seen =
        reinterpret_cast<const std::atomic<uint64_t>*>(group.bases[peer] + ShmProbeOffset())
            ->load(std::memory_order_acquire);
    if (absl::Status s = ProbeCrossMemoryAttach(static_cast<int>(pid), addr + ShmProbeOffset(),
                                                &seen, sizeof(seen));
        !s.ok()) {
      return absl::StrCat("cma refused: rank ", rank, " reading rank ", peer, ": ", s.message());
    }
  }
  return "cma ok";
}

}  // namespace

absl::Status SetUpSharedMemory(Channel& channel, Store& store, const std::string& prefix,
                               const UcxOptions& options, size_t small_bytes, ShmGroup* group,
                               ShmSegments* segments) {
  const int rank = channel.rank(), size = channel.size();
  // Mailboxes for the header round when a header with a small payload is
  // small enough to keep two of per rank (the default 4 KiB is).
  const size_t header_bytes = sizeof(Header) + small_bytes;
  const size_t mailbox_bytes = header_bytes <= kMaxMailboxBytes ? header_bytes : 0;
  const size_t bytes = ShmSegmentBytes(size, options.shm_chunk_bytes, mailbox_bytes);
  // Every rank says whether it could set up and map everything; the path is
  // used only if all could, so all ranks pick the same algorithm.
  std::string why;
  void* local = nullptr;
  const bool cma_wanted =
      options.cma_min_bytes > 0 && options.cma_max_bytes >= options.cma_min_bytes;
  if (cma_wanted) AllowCrossMemoryAttach();  // before any peer probes this rank
  const std::string mine =
      PackSegment(channel, bytes, options.shm_chunk_bytes, mailbox_bytes, segments, &local, &why);
  PrefixStore scoped(prefix + "/shm", store);
  auto all = StoreAllGather(scoped, "ucx/shm", rank, size, mine,
                            absl::Now() + options.rendezvous_timeout);
  if (!all.ok()) return all.status();

  // Endpoints must be wired up before remote keys can be unpacked.
  if (absl::Status s = channel.FlushEndpoints(absl::Now() + options.rendezvous_timeout);
      !s.ok() && why.empty()) {
    why = std::string(s.message());
  }
  *group = ShmGroup{};
  group->rank = rank;
  group->size = size;
  group->chunk_bytes = options.shm_chunk_bytes;
  group->mailbox_bytes = mailbox_bytes;
  group->bases.assign(size, nullptr);
  segments->rkeys.assign(size, nullptr);
  group->bases[rank] = static_cast<unsigned char*>(local);
  MapPeers(channel, *all, group, segments, &why);
  // "ok" names the segment's layout: ranks whose options or builds differ
  // would read each other's segments at other offsets, so they all fall
  // back instead.
  const std::string ok = absl::StrCat("ok ", options.shm_chunk_bytes, " ", mailbox_bytes,
                                      " layout ", kShmLayoutVersion);
  PrefixStore scoped_ok(prefix + "/shm-ok", store);
  auto verdicts = StoreAllGather(scoped_ok, "ucx/shm-ok", rank, size, why.empty() ? ok : why,
                                 absl::Now() + options.rendezvous_timeout);
  if (!verdicts.ok()) return verdicts.status();
  segments->enabled = std::all_of(verdicts->begin(), verdicts->end(),
                                  [&](const std::string& v) { return v == (*verdicts)[0]; }) &&
                      absl::StartsWith((*verdicts)[0], "ok ");
  segments->exchange = segments->enabled && mailbox_bytes > 0;
  // Note [Faulting the segments in]: every segment is now known to be this
  // size.
  if (segments->enabled && FaultInGroup(size, bytes)) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer != rank) FaultInShmSegment(group->bases[peer], bytes);
    }
  }
  if (!segments->enabled) return absl::OkStatus();
  // Every rank says whether it can read every other by cross-memory attach
  // (and wants to); the single copy runs only where all can.
  PrefixStore scoped_cma(prefix + "/shm-cma", store);
  auto cma = StoreAllGather(scoped_cma, "ucx/shm-cma", rank, size,
                            ProbePeers(*all, *group, rank, cma_wanted),
                            absl::Now() + options.rendezvous_timeout);
  if (!cma.ok()) return cma.status();
  segments->cma_verdict = "cma ok";
  for (const std::string& v : *cma) {
    if (v != "cma ok") {
      segments->cma_verdict = v;
      break;
    }
  }
  if (segments->cma_verdict == "cma ok") {
    group->pids.resize(size);
    for (int r = 0; r < size; ++r) {
      uint64_t pid;
      std::memcpy(&pid, (*all)[r].data() + sizeof(uint64_t), sizeof(pid));
      group->pids[r] = static_cast<int>(pid);
    }
    group->cma_min_bytes = options.cma_min_bytes;
    group->cma_max_bytes = options.cma_max_bytes;
  }
  return absl::OkStatus();
}

void ShmSegments::DestroyKeys() {
  for (ucp_rkey_h& k : rkeys) {
    if (k != nullptr) ucp_rkey_destroy(k);
    k = nullptr;
  }
}

void ShmSegments::Unmap(ucp_context_h context) {
  if (memh != nullptr) ucp_mem_unmap(context, memh);
  memh = nullptr;
}

}  // namespace fusebox::comm::ucx
