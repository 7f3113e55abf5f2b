// The UCX backend's collective descriptor (a wire format): what one rank
// called, compared across ranks before any data moves (Note [UCX collective
// protocol] in communicator.cc, Note [Descriptor round] in
// descriptor_round.h).
#ifndef FUSEBOX_COMM_UCX_HEADER_H_
#define FUSEBOX_COMM_UCX_HEADER_H_

#include <cstdint>
#include <string>

namespace fusebox::comm::ucx {

inline constexpr uint32_t kHeaderMagic = 0x46425831;  // "FBX1"

struct Header {
  uint32_t magic;
  uint8_t kind;  // CollectiveKind
  uint8_t type;  // DataType
  uint8_t op;    // ReduceOp
  uint8_t pad;
  int32_t root;
  int32_t sender;
  uint64_t count;
  uint64_t seq;
};
static_assert(sizeof(Header) == 32, "Header is a wire format");

// "AllReduce(count=10, type=float, op=sum, seq=3)": what the header asks for.
std::string Describe(const Header& h);

// Whether two ranks' headers describe the same collective (every field but
// magic, sender and pad).
bool SameCall(const Header& a, const Header& b);

}  // namespace fusebox::comm::ucx

#endif  // FUSEBOX_COMM_UCX_HEADER_H_
