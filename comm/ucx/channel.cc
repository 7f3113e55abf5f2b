// The UCX backend's channel. See channel.h.
#include "comm/ucx/channel.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace fusebox::comm::ucx {
namespace {

constexpr uint64_t kNoticeTagMask = ((uint64_t{1} << kStepBits) - 1) << kIndexBits;
constexpr uint32_t kNoticeMagic = 0x46425846;  // "FBXF"

}  // namespace

std::string UcsError(ucs_status_t s) { return ucs_status_string(s); }

bool TcpOnly(const UcxOptions& options) {
  // ucx_config is applied after transports: its last TLS wins.
  std::string tls = options.transports;
  for (const auto& [name, value] : options.ucx_config) {
    if (absl::EqualsIgnoreCase(name, "TLS")) tls = value;
  }
  bool tcp_only = !tls.empty();
  for (absl::string_view t : absl::StrSplit(tls, ',')) {
    t = absl::StripAsciiWhitespace(t);
    if (!absl::EqualsIgnoreCase(t, "tcp") && !absl::EqualsIgnoreCase(t, "self")) tcp_only = false;
  }
  return tcp_only;
}

std::vector<std::pair<std::string, std::string>> UcxSettings(const UcxOptions& options) {
  std::vector<std::pair<std::string, std::string>> settings;
  if (!options.transports.empty()) settings.push_back({"TLS", options.transports});
  // A setting the user gave UCX stands: in ucx_config, or in UCX's own
  // environment variables, which ucp_config_read and the transports read
  // and a modification here would silently replace.
  const auto user_set = [&](std::initializer_list<const char*> names) {
    for (const char* name : names) {
      if (std::getenv(absl::StrCat("UCX_", name).c_str()) != nullptr ||
          absl::c_any_of(options.ucx_config,
                         [&](const auto& kv) { return absl::EqualsIgnoreCase(kv.first, name); })) {
        return true;
      }
    }
    return false;
  };
  if (TcpOnly(options) && options.tcp_eager_bytes > 0) {
    if (!user_set({"RNDV_THRESH"})) {
      settings.push_back({"RNDV_THRESH", absl::StrCat(options.tcp_eager_bytes)});
    }
    // Receive segments as large as the eager limit, where that is above
    // UCX's TCP default of 64 KiB (at most 1 MiB: UCX allocates two per
    // receive buffer). On 8 emulated hosts at 1 Gbit, allreduces whose
    // messages were exactly 128 KiB took 2-5x as long in steady state as
    // those of 124 or 132 KiB (Rabenseifner at 256 KiB: 7.6-18.8 ms against
    // 3.8-5.8), and 4.3-4.9 ms with 256 KiB segments
    // (commit 2d349ba). A transport's
    // setting, so named without its TCP_ prefix, which ucp_config_modify
    // hands to the transports (TCP_RX_SEG_SIZE there is an "invalid
    // configuration"; only tcp has an RX_SEG_SIZE). In the environment it is
    // UCX_TCP_RX_SEG_SIZE.
    constexpr size_t kUcxRxSegBytes = size_t{64} << 10, kMaxRxSegBytes = size_t{1} << 20;
    if (options.tcp_eager_bytes > kUcxRxSegBytes && std::getenv("UCX_TCP_RX_SEG_SIZE") == nullptr &&
        !user_set({"RX_SEG_SIZE"})) {
      settings.push_back(
          {"RX_SEG_SIZE", absl::StrCat(std::min(options.tcp_eager_bytes, kMaxRxSegBytes))});
    }
  }
  settings.insert(settings.end(), options.ucx_config.begin(), options.ucx_config.end());
  return settings;
}

Channel::~Channel() {
  Close(/*force=*/true);
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

absl::StatusOr<std::string> Channel::Open(const UcxOptions& options, bool rma) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return absl::InternalError("ucp_config_read: " + UcsError(st));
  for (const auto& [name, value] : UcxSettings(options)) {
    st = ucp_config_modify(config, name.c_str(), value.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return absl::InvalidArgumentError(
          absl::StrCat("UCX option ", name, "=", value, ": ", UcsError(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  // Sleeping on the worker's event fd (set_sleep_when_idle) needs wake-up
  // events, which every TCP interface has; asked for only there, so that no
  // transport without them is ever left out.
  const bool wakeup = TcpOnly(options);
  params.features =
      UCP_FEATURE_TAG | (rma ? UCP_FEATURE_RMA : 0) | (wakeup ? UCP_FEATURE_WAKEUP : 0);
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK) return absl::UnavailableError("ucp_init: " + UcsError(st));

  ucp_worker_params_t wparams{};
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
  st = ucp_worker_create(context_, &wparams, &worker_);
  if (st != UCS_OK) return absl::UnavailableError("ucp_worker_create: " + UcsError(st));

  if (wakeup) {
    st = ucp_worker_get_efd(worker_, &event_fd_);
    if (st != UCS_OK) return absl::UnavailableError("ucp_worker_get_efd: " + UcsError(st));
  }

  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  st = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (st != UCS_OK) return absl::UnavailableError("ucp_worker_get_address: " + UcsError(st));
  std::string mine(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);
  return mine;
}

absl::Status Channel::Connect(const std::vector<std::string>& addresses, bool detect_peer_failure) {
  if (static_cast<int>(addresses.size()) != size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("UCX channel: ", addresses.size(), " addresses for ", size_, " ranks"));
  }
  eps_.assign(size_, nullptr);
  peer_status_.assign(size_, UCS_OK);
  peer_failed_seen_.assign(size_, absl::InfiniteFuture());
  ep_error_args_.resize(size_);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const std::string& a = addresses[peer];
    if (a.empty() || a.size() > (1u << 20)) {
      return absl::DataLossError(
          absl::StrCat("rank ", peer, " published a malformed UCX address (", a.size(), " bytes)"));
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = reinterpret_cast<const ucp_address_t*>(a.data());
    ep.err_mode = detect_peer_failure ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
    ep.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      auto* a = static_cast<EpErrorArg*>(arg);
      a->self->peer_status_[a->peer] = status;
    };
    ep_error_args_[peer] = {this, peer};
    ep.err_handler.arg = &ep_error_args_[peer];
    ucs_status_t st = ucp_ep_create(worker_, &ep, &eps_[peer]);
    if (st != UCS_OK) {
      return absl::UnavailableError(
          absl::StrCat("ucp_ep_create to rank ", peer, ": ", UcsError(st)));
    }
  }
  if (size_ > 1) {
    PostRecv(-1, &notice_in_, sizeof(notice_in_), MakeTag(0, kNoticeStep, 0), &notice_recv_,
             kNoticeTagMask);
  }
  return absl::OkStatus();
}

absl::Status Channel::FlushEndpoints(absl::Time deadline) {
  absl::Status first;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    ucp_request_param_t fp{};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(eps_[peer], &fp);
    ucs_status_t fst = UCS_PTR_STATUS(r);
    if (UCS_PTR_IS_PTR(r)) {
      while ((fst = ucp_request_check_status(r)) == UCS_INPROGRESS && absl::Now() < deadline) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(r);
    }
    if (fst != UCS_OK && first.ok()) {
      first = absl::UnavailableError(
          absl::StrCat("rank ", rank_, " could not connect to rank ", peer, ": ", UcsError(fst)));
    }
  }
  return first;
}

void Channel::Close(bool force) {
  if (closed_) return;
  closed_ = true;
  Release(&notice_recv_, /*is_recv=*/true);
  // Close endpoints with a flush, bounded in time: a peer that is gone must
  // not make the destructor hang.
  std::vector<void*> closing;
  for (size_t peer = 0; peer < eps_.size(); ++peer) {
    ucp_ep_h ep = eps_[peer];
    if (ep == nullptr) continue;
    eps_[peer] = nullptr;
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = peer_status_[peer] == UCS_OK && !force ? 0 : UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  for (void* r : closing) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    // Released even while still closing (UCX finishes or drops it with the
    // worker): a request never released is a leak that UCX's own checks
    // assert on in ucp_worker_destroy.
    ucp_request_free(r);
  }
}

void Channel::PostSend(int peer, const void* buf, size_t len, ucp_tag_t tag, Pending* p) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = [](void*, ucs_status_t status, void* user) {
    auto* pp = static_cast<Pending*>(user);
    pp->status = status;
    pp->done = true;
  };
  param.user_data = p;
  *p = Pending{};
  p->peer = peer;
  ++sends_;
  ucs_status_ptr_t r = ucp_tag_send_nbx(eps_[peer], buf, len, tag, &param);
  if (r == nullptr) {
    p->done = true;
  } else if (UCS_PTR_IS_ERR(r)) {
    p->done = true;
    p->status = UCS_PTR_STATUS(r);
  } else {
    p->request = r;
  }
}

void Channel::PostRecv(int peer, void* buf, size_t len, ucp_tag_t tag, Pending* p,
                       ucp_tag_t tag_mask) {
  ucp_request_param_t param{};
  // Always through the callback, which reports the received length (UCX
  // 1.13 leaves recv_info empty on immediate completion).
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = [](void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
    auto* pp = static_cast<Pending*>(user);
    pp->status = status;
    pp->length = info != nullptr ? info->length : 0;
    pp->done = true;
  };
  param.user_data = p;
  *p = Pending{};
  p->peer = peer;
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buf, len, tag, tag_mask, &param);
  if (UCS_PTR_IS_ERR(r)) {
    p->done = true;
    p->status = UCS_PTR_STATUS(r);
  } else {
    p->request = r;
  }
}

absl::Status Channel::Progress(int peer) {
  bool slept = false;
  if (ucp_worker_progress(worker_) != 0) {
    idle_run_ = 0;
  } else if (sleep_when_idle_ && event_fd_ >= 0) {
    // Note [Waiting where ranks outnumber cores].
    if (idle_run_ < UINT_MAX) ++idle_run_;
    if (idle_run_ > yields_before_sleep_) {
      slept = Sleep();
      if (slept) ++idle_sleeps_;
    } else {
      ++idle_yields_;
      sched_yield();
    }
  } else if ((++idle_polls_ & yield_mask_) == 0) {
    // Nothing happened: let an oversubscribed peer run.
    sched_yield();
  }
  if (abort_->load(std::memory_order_relaxed)) {
    return absl::CancelledError("communicator destroyed while a collective was in flight");
  }
  if (notice_recv_.done) return NoticeError();
  if (peer >= 0 && peer_status_[peer] != UCS_OK) {
    if (absl::Status s = PeerGone(peer); !s.ok()) return s;
  }
  if (((++deadline_polls_ & 63) == 0 || slept) && absl::Now() >= deadline_) {
    // A peer already seen gone is what the wait was stuck on.
    if (peer >= 0 && peer_status_[peer] != UCS_OK) return PeerGone(peer, /*now_or_never=*/true);
    return absl::DeadlineExceededError(peer >= 0 ? absl::StrCat("still waiting for rank ", peer)
                                                 : "still waiting");
  }
  return absl::OkStatus();
}

absl::Status Channel::PeerGone(int peer, bool now_or_never) {
  const absl::Time now = absl::Now();
  absl::Time& seen = peer_failed_seen_[peer];
  if (seen == absl::InfiniteFuture()) seen = now;
  if (!now_or_never && now - seen < kPeerGoneGrace) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "rank ", peer, " is unreachable (its UCX endpoint failed: ", UcsError(peer_status_[peer]),
      "); it may have exited or crashed"));
}

bool Channel::Sleep() {
  // Armed, the worker's fd becomes readable when anything arrives or
  // completes. BUSY: something already did; progress again at once. A
  // worker that cannot be armed yields from then on. The bound keeps the
  // abort flag and the deadline looked at.
  const ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return false;
  if (st != UCS_OK) {
    event_fd_ = -1;
    sched_yield();
    return false;
  }
  pollfd fd{event_fd_, POLLIN, 0};
  poll(&fd, 1, /*timeout_ms=*/10);
  return true;
}

absl::Status Channel::NoticeError() const {
  const FailureNotice& n = notice_in_;
  if (notice_recv_.status != UCS_OK || notice_recv_.length != sizeof(n) ||
      n.magic != kNoticeMagic || n.sender < 0 || n.sender >= size_ || n.sender == rank_) {
    return absl::AbortedError(absl::StrCat(
        "received a malformed failure notice (", notice_recv_.length, " bytes, status ",
        UcsError(notice_recv_.status), "); treating the job as failed"));
  }
  return absl::AbortedError(absl::StrCat("rank ", n.sender, " gave up on collective seq=", n.seq,
                                         " and told the others"));
}

void Channel::NotifyPeers(uint64_t seq) {
  notice_out_ = FailureNotice{kNoticeMagic, rank_, seq};
  std::vector<void*> sending;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_ || peer_status_[peer] != UCS_OK) continue;
    ucp_request_param_t param{};  // no callback: the requests are freed below
    ucs_status_ptr_t r = ucp_tag_send_nbx(eps_[peer], &notice_out_, sizeof(notice_out_),
                                          MakeTag(0, kNoticeStep, rank_), &param);
    if (UCS_PTR_IS_PTR(r)) sending.push_back(r);
  }
  // Small messages mostly go out at once; a peer that is gone must not hold
  // this rank up. Requests still in flight are handed back to UCX, which
  // completes or (when the endpoints close) cancels them.
  const absl::Time until = absl::Now() + absl::Milliseconds(100);
  for (void* r : sending) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS && absl::Now() < until) {
      ucp_worker_progress(worker_);
    }
    ucp_request_free(r);
  }
}

absl::Status Channel::WaitFor(Pending* p) {
  while (!p->done) {
    if (absl::Status s = Progress(p->peer); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Channel::Finish(Pending* p, const char* what) {
  absl::Status s = WaitFor(p);
  if (p->request != nullptr && p->done) {
    ucp_request_free(p->request);
    p->request = nullptr;
  }
  // A failed wait leaves the request to the caller's error path (Release).
  if (absl::IsDeadlineExceeded(s)) {
    return absl::DeadlineExceededError(absl::StrCat(s.message(), " (", what, ")"));
  }
  if (!s.ok()) return s;
  if (p->status != UCS_OK) {
    return absl::UnavailableError(absl::StrCat("UCX ", what, " failed: ", UcsError(p->status)));
  }
  return absl::OkStatus();
}

absl::Status Channel::SendRecv(int peer, const void* send_buf, void* recv_buf, size_t len,
                               ucp_tag_t tag, const char* what) {
  Pending r, snd;
  if (recv_buf != nullptr) PostRecv(peer, recv_buf, len, tag, &r);
  if (send_buf != nullptr) PostSend(peer, send_buf, len, tag, &snd);
  absl::Status s;
  if (recv_buf != nullptr) {
    s = Finish(&r, what);
    if (s.ok() && r.length != len) {
      s = absl::DataLossError(
          absl::StrCat(what, " from rank ", peer, ": got ", r.length, " bytes, expected ", len));
    }
  }
  if (s.ok() && send_buf != nullptr) s = Finish(&snd, what);
  if (!s.ok()) {
    Release(&r, /*is_recv=*/true);
    Release(&snd, /*is_recv=*/false);
  }
  return s;
}

void Channel::Release(Pending* p, bool is_recv) {
  if (p->request == nullptr) return;
  if (!p->done && is_recv) ucp_request_cancel(worker_, p->request);
  ucp_request_free(p->request);
  p->request = nullptr;
}

}  // namespace fusebox::comm::ucx
