// The UCX backend's shared-memory segments. See shm_setup.h.
#include "comm/ucx/shm_setup.h"

#include <algorithm>
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
    const uint64_t addr = reinterpret_cast<uintptr_t>(*local);
    mine.assign(reinterpret_cast<const char*>(&addr), sizeof(addr));
    mine.append(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    InitShmSegment(static_cast<unsigned char*>(*local), channel.size(), chunk_bytes,
                   mailbox_bytes);
  } else {
    *why = absl::StrCat("rank ", channel.rank(), ": ", UcsError(st));
  }
  return mine;
}

// Maps every peer's segment from what it published (`all`); on failure,
// *why says which.
void MapPeers(Channel& channel, const std::vector<std::string>& all, ShmGroup* group,
              ShmSegments* segments, std::string* why) {
  const int rank = channel.rank(), size = channel.size();
  for (int peer = 0; peer < size && why->empty(); ++peer) {
    if (peer == rank) continue;
    const std::string& blob = all[peer];
    if (blob.size() <= sizeof(uint64_t)) {
      *why = absl::StrCat("rank ", peer, " has no shared segment");
      break;
    }
    uint64_t raddr;
    std::memcpy(&raddr, blob.data(), sizeof(raddr));
    ucs_status_t st =
        ucp_ep_rkey_unpack(channel.endpoint(peer), blob.data() + sizeof(raddr),
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
  *group = ShmGroup{rank, size, options.shm_chunk_bytes, {}, mailbox_bytes};
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
