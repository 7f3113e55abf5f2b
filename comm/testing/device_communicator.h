// A device communicator for tests (Note [Device communicators] in
// comm/communicator.h) on the emulated device (comm/device.h): what NCCL is
// to a CUDA device, without a GPU. Its collectives run on a stream of its
// own on `device`, in issue order, each as a host function on that stream
// that runs the collective through a host communicator (the loopback's:
// ranks as threads) and completes the Work when it returns. The emulated
// device's memory is host memory, so the host communicator reduces it in
// place; the stream makes the ordering real: AllReduceAfter's collective
// reads its buffer only once `ready` is done, and a late stream (the
// device's delays) makes a caller that forgot an event read stale data.
//
//   auto host = CreateLoopbackGroup(world);           // rank r: (*host)[r]
//   auto device = CreateEmulatedDevice(LateStreams());
//   auto comm = CreateEmulatedDeviceCommunicator(*(*host)[r], *device);
//   comm->AllReduceAfter(*event, buf, buf, n, kFloat32, kSum);
#ifndef FUSEBOX_COMM_TESTING_DEVICE_COMMUNICATOR_H_
#define FUSEBOX_COMM_TESTING_DEVICE_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/device.h"

namespace fusebox::comm::testing {

// `host` and `device` (an emulated device: its memory is host memory) must
// outlive the result. backend() is "emulated-device:" + host's backend.
absl::StatusOr<std::unique_ptr<Communicator>> CreateEmulatedDeviceCommunicator(
    Communicator& host, Device& device);

}  // namespace fusebox::comm::testing

#endif  // FUSEBOX_COMM_TESTING_DEVICE_COMMUNICATOR_H_
