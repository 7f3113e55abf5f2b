// Multi-process tests of the MPI backend and the MPI rendezvous. Run under
// mpirun with 1..5 ranks (tests/comm/mpi_tests.cmake). Every rank runs the
// same tests in the same order, so each test is itself a sequence of
// collectives; assertions that could differ between ranks are EXPECTs, never
// early returns, so that a failure on one rank cannot leave the others
// waiting in a collective.
// Only the C API: OpenMPI's deprecated C++ bindings need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "comm/communicator.h"
#include "comm/mpi/communicator.h"
#include "comm/mpi/rendezvous.h"
#include "comm/testing/exact_data.h"
#include "gtest/gtest.h"

namespace fusebox::comm {
namespace {

using testing::CountMismatches;
using testing::FillExpected;
using testing::FillInput;


using Bytes = std::vector<unsigned char>;

Bytes MakeBytes(size_t count, DataType t) { return Bytes(count * DataTypeSize(t)); }

std::string Describe(size_t count, DataType t, ReduceOp op, bool in_place) {
  return absl::StrCat("count=", count, " ", DataTypeName(t), " ", ReduceOpName(op),
                      in_place ? " in-place" : " out-of-place");
}

class MpiCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = CreateMpiCommunicator(MpiOptions{});
    ASSERT_TRUE(c.ok()) << c.status();
    comm_ = *std::move(c);
    rank_ = comm_->rank();
    size_ = comm_->size();
  }

  // One AllReduce in flight: its buffers live as long as the case.
  struct ReduceCase {
    size_t count;
    DataType type;
    ReduceOp op;
    bool in_place;
    Bytes send, recv;
    std::shared_ptr<Work> work;
  };

  // Issues `c` without waiting.
  void Issue(ReduceCase& c, uint64_t seed) {
    c.send = MakeBytes(c.count, c.type);
    FillInput(c.send.data(), c.count, c.type, c.op, rank_, seed);
    if (c.in_place) {
      c.recv = c.send;
    } else {
      c.recv = MakeBytes(c.count, c.type);
      std::fill(c.recv.begin(), c.recv.end(), 0xCD);
    }
    const void* send = c.in_place ? c.recv.data() : c.send.data();
    auto w = comm_->AllReduce(send, c.recv.data(), c.count, c.type, c.op);
    ASSERT_TRUE(w.ok()) << w.status();
    c.work = *std::move(w);
  }

  // Waits for `c` and compares bit for bit with the reference.
  void Check(ReduceCase& c, uint64_t seed) {
    const std::string what = Describe(c.count, c.type, c.op, c.in_place);
    EXPECT_TRUE(c.work->Wait().ok()) << what << ": " << c.work->status();
    Bytes want = MakeBytes(c.count, c.type);
    FillExpected(want.data(), c.count, c.type, c.op, size_, seed);
    EXPECT_EQ(CountMismatches(c.recv.data(), want.data(), c.count, c.type), 0u)
        << what;
  }

  std::unique_ptr<Communicator> comm_;
  int rank_ = 0;
  int size_ = 1;
};

TEST(MpiOptionsTest, ANonPositiveTimeoutIsRejected) {
  MpiOptions options;
  options.timeout = absl::ZeroDuration();
  EXPECT_EQ(CreateMpiCommunicator(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MpiCommunicatorTest, ReportsRankSizeAndBackend) {
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(comm_->rank(), world_rank);
  EXPECT_EQ(comm_->size(), world_size);
  EXPECT_EQ(comm_->backend(), "mpi");
  EXPECT_EQ(comm_->memory(), MemoryKind::kHost);
}

// The full type x op x placement matrix on small and unaligned sizes, all
// 70 cases of one size in flight at once.
TEST_F(MpiCommunicatorTest, AllReduceEveryTypeAndOp) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4096}}) {
    std::vector<ReduceCase> cases;
    for (DataType t : kAllDataTypes) {
      for (ReduceOp op : kAllReduceOps) {
        for (bool in_place : {false, true}) {
          cases.push_back(ReduceCase{count, t, op, in_place, {}, {}, nullptr});
        }
      }
    }
    for (ReduceCase& c : cases) Issue(c, count);
    for (ReduceCase& c : cases) Check(c, count);
  }
}

// 1M+3 elements for a few type/op pairs, and a 64 MB float buffer.
TEST_F(MpiCommunicatorTest, AllReduceLargeBuffers) {
  const size_t kOddMillion = (size_t{1} << 20) + 3;
  std::vector<ReduceCase> cases = {
      {kOddMillion, DataType::kFloat32, ReduceOp::kSum, false, {}, {}, nullptr},
      {kOddMillion, DataType::kFloat64, ReduceOp::kMax, true, {}, {}, nullptr},
      {kOddMillion, DataType::kBFloat16, ReduceOp::kAvg, false, {}, {}, nullptr},
      {kOddMillion, DataType::kInt32, ReduceOp::kSum, true, {}, {}, nullptr},
      {kOddMillion, DataType::kFloat16, ReduceOp::kProd, true, {}, {}, nullptr},
  };
  for (ReduceCase& c : cases) Issue(c, 11);
  for (ReduceCase& c : cases) Check(c, 11);

  ReduceCase big{(size_t{64} << 20) / sizeof(float), DataType::kFloat32,
                 ReduceOp::kSum, true, {}, {}, nullptr};
  Issue(big, 5);
  Check(big, 5);
}

TEST_F(MpiCommunicatorTest, AllReduceCompletesInIssueOrder) {
  constexpr int kOps = 32;
  std::vector<ReduceCase> cases;
  for (int i = 0; i < kOps; ++i) {
    // Large and small interleaved: a small one must not overtake.
    const size_t count = i % 4 == 0 ? (size_t{1} << 18) : 5;
    cases.push_back(ReduceCase{count, DataType::kFloat32, ReduceOp::kSum,
                               i % 2 == 0, {}, {}, nullptr});
  }
  std::mutex mu;
  std::vector<int> order;
  for (int i = 0; i < kOps; ++i) {
    Issue(cases[i], i);
    cases[i].work->OnComplete([&, i](const absl::Status&) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  for (int i = 0; i < kOps; ++i) Check(cases[i], i);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), static_cast<size_t>(kOps));
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(order[i], i);
}

TEST_F(MpiCommunicatorTest, AllReduceMultiReducesEveryTensor) {
  std::vector<ReduceCase> cases = {
      {7, DataType::kFloat32, ReduceOp::kMax, true, {}, {}, nullptr},
      {1023, DataType::kInt64, ReduceOp::kMax, true, {}, {}, nullptr},
      {0, DataType::kFloat16, ReduceOp::kMax, true, {}, {}, nullptr},
      {4096, DataType::kBFloat16, ReduceOp::kMax, true, {}, {}, nullptr},
  };
  std::vector<TensorRef> refs;
  for (ReduceCase& c : cases) {
    c.recv = MakeBytes(c.count, c.type);
    FillInput(c.recv.data(), c.count, c.type, c.op, rank_, 3);
    refs.push_back(TensorRef{c.recv.data(), c.count, c.type});
  }
  auto w = comm_->AllReduceMulti(refs, ReduceOp::kMax);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait().ok()) << (*w)->status();
  for (ReduceCase& c : cases) {
    Bytes want = MakeBytes(c.count, c.type);
    FillExpected(want.data(), c.count, c.type, c.op, size_, 3);
    EXPECT_EQ(CountMismatches(c.recv.data(), want.data(), c.count, c.type), 0u)
        << Describe(c.count, c.type, c.op, true);
  }
}

TEST_F(MpiCommunicatorTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size_; ++root) {
    for (DataType t : kAllDataTypes) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}}) {
        Bytes buf = MakeBytes(count, t);
        if (rank_ == root) {
          FillInput(buf.data(), count, t, ReduceOp::kMin, root, count);
        } else {
          std::fill(buf.begin(), buf.end(), 0xAB);
        }
        auto w = comm_->Broadcast(buf.data(), count, t, root);
        ASSERT_TRUE(w.ok()) << w.status();
        EXPECT_TRUE((*w)->Wait().ok()) << (*w)->status();
        Bytes want = MakeBytes(count, t);
        FillInput(want.data(), count, t, ReduceOp::kMin, root, count);
        EXPECT_EQ(CountMismatches(buf.data(), want.data(), count, t), 0u)
            << "root " << root << " count " << count << " " << DataTypeName(t);
      }
    }
  }
  // One large broadcast from the last rank.
  const size_t count = (size_t{1} << 20) + 3;
  Bytes buf = MakeBytes(count, DataType::kFloat32);
  if (rank_ == size_ - 1) {
    FillInput(buf.data(), count, DataType::kFloat32, ReduceOp::kMax, rank_);
  }
  auto w = comm_->Broadcast(buf.data(), count, DataType::kFloat32, size_ - 1);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->Wait().ok()) << (*w)->status();
  Bytes want = MakeBytes(count, DataType::kFloat32);
  FillInput(want.data(), count, DataType::kFloat32, ReduceOp::kMax, size_ - 1);
  EXPECT_EQ(CountMismatches(buf.data(), want.data(), count, DataType::kFloat32), 0u);
}

void CheckAllGather(Communicator& comm, bool in_place) {
  const int rank = comm.rank();
  const int size = comm.size();
  for (DataType t : kAllDataTypes) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1023}, size_t{4096}}) {
      const size_t bytes = count * DataTypeSize(t);
      Bytes send = MakeBytes(count, t);
      FillInput(send.data(), count, t, ReduceOp::kSum, rank, count);
      Bytes recv(bytes * static_cast<size_t>(size), 0xEE);
      const void* src = send.data();
      if (in_place) {
        unsigned char* mine = recv.data() + static_cast<size_t>(rank) * bytes;
        if (bytes != 0) std::memcpy(mine, send.data(), bytes);
        src = mine;
      }
      auto w = comm.AllGather(src, recv.data(), count, t);
      ASSERT_TRUE(w.ok()) << w.status();
      EXPECT_TRUE((*w)->Wait().ok()) << (*w)->status();
      Bytes want(recv.size());
      for (int r = 0; r < size; ++r) {
        FillInput(want.data() + static_cast<size_t>(r) * bytes, count, t,
                  ReduceOp::kSum, r, count);
      }
      EXPECT_EQ(CountMismatches(recv.data(), want.data(),
                                count * static_cast<size_t>(size), t),
                0u)
          << "count " << count << " " << DataTypeName(t)
          << (in_place ? " in-place" : " out-of-place");
    }
  }
}

TEST_F(MpiCommunicatorTest, AllGatherOutOfPlace) { CheckAllGather(*comm_, false); }

TEST_F(MpiCommunicatorTest, AllGatherInPlace) { CheckAllGather(*comm_, true); }

// Rank 0 writes a file just before entering the barrier, after a pause; every
// rank must see it once its barrier returns (all ranks share one host here).
TEST_F(MpiCommunicatorTest, BarrierWaitsForEveryRank) {
  char path[256] = {};
  if (rank_ == 0) {
    std::string tmpl = ::testing::TempDir() + "fusebox_barrier_XXXXXX";
    std::snprintf(path, sizeof(path), "%s", tmpl.c_str());
    ASSERT_NE(mkdtemp(path), nullptr);
  }
  auto w = comm_->Broadcast(path, sizeof(path), DataType::kUInt8, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Wait().ok());
  const std::string flag = std::string(path) + "/flag";
  ASSERT_TRUE(BarrierSync(*comm_).ok());
  if (rank_ == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::ofstream(flag) << "x";
  }
  ASSERT_TRUE(BarrierSync(*comm_).ok());
  EXPECT_EQ(access(flag.c_str(), F_OK), 0) << "rank " << rank_ << " left the barrier early";
  ASSERT_TRUE(BarrierSync(*comm_).ok());
  if (rank_ == 0) {
    std::remove(flag.c_str());
    rmdir(path);
  }
}

TEST_F(MpiCommunicatorTest, MismatchedCountsNameBothSides) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  const size_t count = rank_ == size_ - 1 ? 200 : 100;
  std::vector<float> send(count, 1.0f), recv(count);
  absl::Status s = AllReduceSync(*comm_, send.data(), recv.data(), count,
                                 DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("AllReduce mismatch"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("rank 0 has count=100 float sum"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("rank ", size_ - 1, " has count=200 float sum")),
            absl::string_view::npos)
      << s;
  // The communicator stays usable: the next matching call succeeds.
  std::vector<float> ok_send(100, 1.0f), ok_recv(100);
  EXPECT_TRUE(AllReduceSync(*comm_, ok_send.data(), ok_recv.data(), 100,
                            DataType::kFloat32, ReduceOp::kSum)
                  .ok());
  EXPECT_EQ(ok_recv[99], static_cast<float>(size_));
}

TEST_F(MpiCommunicatorTest, MismatchedTypesNameBothSides) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  const DataType t = rank_ == 1 ? DataType::kFloat64 : DataType::kFloat32;
  Bytes buf = MakeBytes(64, t);
  absl::Status s = AllReduceSync(*comm_, buf.data(), buf.data(), 64, t, ReduceOp::kMax);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("count=64 float max"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("rank 1 has count=64 double max"), absl::string_view::npos) << s;
}

TEST_F(MpiCommunicatorTest, MismatchedKindsAndRootsAreErrors) {
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<float> buf(16, 0.0f);
  absl::StatusOr<std::shared_ptr<Work>> w =
      rank_ == 0 ? comm_->Broadcast(buf.data(), 16, DataType::kFloat32, 0)
                 : comm_->AllReduce(buf.data(), buf.data(), 16, DataType::kFloat32,
                                    ReduceOp::kSum);
  ASSERT_TRUE(w.ok()) << w.status();
  absl::Status s = (*w)->Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("AllReduce count=16 float sum"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("Broadcast count=16 float root=0"), absl::string_view::npos) << s;

  w = comm_->Broadcast(buf.data(), 16, DataType::kFloat32, rank_ == 0 ? 0 : 1);
  ASSERT_TRUE(w.ok()) << w.status();
  s = (*w)->Wait();
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("root=0"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("root=1"), absl::string_view::npos) << s;
}

// Bad arguments are rejected before anything is issued, so the barrier that
// follows matches on every rank.
TEST_F(MpiCommunicatorTest, InvalidArgumentsAreRejectedSynchronously) {
  float x[4] = {};
  auto expect_invalid = [](const absl::StatusOr<std::shared_ptr<Work>>& w,
                           absl::string_view needle) {
    EXPECT_TRUE(absl::IsInvalidArgument(w.status())) << w.status();
    EXPECT_NE(w.status().message().find(needle), absl::string_view::npos) << w.status();
  };
  expect_invalid(comm_->AllReduce(nullptr, x, 4, DataType::kFloat32, ReduceOp::kSum), "null");
  expect_invalid(comm_->AllReduce(x, nullptr, 4, DataType::kFloat32, ReduceOp::kSum), "null");
  expect_invalid(comm_->Broadcast(nullptr, 4, DataType::kFloat32, 0), "null");
  expect_invalid(comm_->AllGather(x, nullptr, 1, DataType::kFloat32), "null");
  expect_invalid(comm_->Broadcast(x, 4, DataType::kFloat32, size_), "root");
  expect_invalid(comm_->Broadcast(x, 4, DataType::kFloat32, -1), "root");
  expect_invalid(comm_->AllReduce(x, x, 4, DataType::kFloat32, static_cast<ReduceOp>(99)),
                 "reduction");
  expect_invalid(comm_->AllReduce(x, x, 4, static_cast<DataType>(42), ReduceOp::kSum),
                 "data type");
  expect_invalid(comm_->AllReduce(x, x, size_t{INT_MAX} + 1, DataType::kUInt8,
                                  ReduceOp::kSum),
                 "split");
  EXPECT_TRUE(BarrierSync(*comm_).ok());
  // A null buffer is fine when there is nothing to move.
  EXPECT_TRUE(AllReduceSync(*comm_, nullptr, nullptr, 0, DataType::kFloat32,
                            ReduceOp::kSum)
                  .ok());
}

TEST_F(MpiCommunicatorTest, DestructorFinishesInFlightWork) {
  auto second = CreateMpiCommunicator(MpiOptions{});
  ASSERT_TRUE(second.ok()) << second.status();
  constexpr size_t kCount = 4096;
  std::vector<std::vector<int32_t>> bufs(8, std::vector<int32_t>(kCount));
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < bufs.size(); ++i) {
    FillInput(bufs[i].data(), kCount, DataType::kInt32, ReduceOp::kSum, rank_, i);
    auto w = (*second)->AllReduce(bufs[i].data(), bufs[i].data(), kCount,
                                  DataType::kInt32, ReduceOp::kSum);
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*std::move(w));
  }
  second->reset();  // never waited on
  std::vector<int32_t> want(kCount);
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_TRUE(works[i]->Test());
    EXPECT_TRUE(works[i]->status().ok()) << works[i]->status();
    FillExpected(want.data(), kCount, DataType::kInt32, ReduceOp::kSum, size_, i);
    EXPECT_EQ(CountMismatches(bufs[i].data(), want.data(), kCount, DataType::kInt32), 0u);
  }
}

TEST_F(MpiCommunicatorTest, TwoCommunicatorsRunConcurrently) {
  auto other = CreateMpiCommunicator(MpiOptions{});
  ASSERT_TRUE(other.ok()) << other.status();
  constexpr size_t kCount = 1023;
  std::vector<std::vector<double>> bufs(16, std::vector<double>(kCount));
  std::vector<std::shared_ptr<Work>> works;
  for (size_t i = 0; i < bufs.size(); ++i) {
    FillInput(bufs[i].data(), kCount, DataType::kFloat64, ReduceOp::kMin, rank_, i);
    Communicator& c = i % 2 == 0 ? *comm_ : **other;
    auto w = c.AllReduce(bufs[i].data(), bufs[i].data(), kCount,
                         DataType::kFloat64, ReduceOp::kMin);
    ASSERT_TRUE(w.ok()) << w.status();
    works.push_back(*std::move(w));
  }
  std::vector<double> want(kCount);
  for (size_t i = 0; i < bufs.size(); ++i) {
    EXPECT_TRUE(works[i]->Wait().ok()) << works[i]->status();
    FillExpected(want.data(), kCount, DataType::kFloat64, ReduceOp::kMin, size_, i);
    EXPECT_EQ(CountMismatches(bufs[i].data(), want.data(), kCount, DataType::kFloat64), 0u);
  }
}

TEST(MpiRendezvousTest, StoreRoundTripAcrossRanks) {
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  auto rdv = ConnectMpiRendezvous(absl::Seconds(60));
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  EXPECT_EQ(rdv->rank, world_rank);
  EXPECT_EQ(rdv->size, world_size);
  EXPECT_EQ(rdv->local_rank, world_rank);  // mpirun here runs on one host
  EXPECT_EQ(rdv->server != nullptr, world_rank == 0);
  ASSERT_NE(rdv->store, nullptr);

  Store& store = *rdv->store;
  EXPECT_TRUE(store.Set(absl::StrCat("mpi-test/", world_rank),
                        absl::StrCat("value of rank ", world_rank))
                  .ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int r = 0; r < world_size; ++r) {
    auto v = store.Get(absl::StrCat("mpi-test/", r), deadline);
    EXPECT_TRUE(v.ok()) << v.status();
    if (v.ok()) {
      EXPECT_EQ(*v, absl::StrCat("value of rank ", r));
    }
  }
  EXPECT_TRUE(store.Add("mpi-test/counter", 1).ok());
  MPI_Barrier(MPI_COMM_WORLD);
  auto total = store.Add("mpi-test/counter", 0);
  EXPECT_TRUE(total.ok()) << total.status();
  if (total.ok()) {
    EXPECT_EQ(*total, world_size);
  }
  // Nobody may still be using the store when rank 0 stops the server.
  MPI_Barrier(MPI_COMM_WORLD);
}

// The last rank never joins a collective (stalled): every other rank's
// AllReduce fails within the timeout plus the post-mortem grace, naming the
// collective and, through the rendezvous store, the silent rank; the
// communicator then refuses work. (The abandoned MPI requests stay pending:
// MPI cannot cancel a collective; the communicator is never used again.)
TEST(MpiTimeoutTest, ARankThatNeverJoinsIsNamedByEveryOtherRank) {
  int world_rank = -1, world_size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto rdv = ConnectMpiRendezvous(absl::Seconds(60));
  ASSERT_TRUE(rdv.ok()) << rdv.status();
  MpiOptions options;
  options.timeout = absl::Milliseconds(500);
  auto comm = CreateMpiCommunicator(options, rdv->store.get());
  ASSERT_TRUE(comm.ok()) << comm.status();
  const int stalled = world_size - 1;
  if (world_rank == stalled) {
    absl::SleepFor(absl::Seconds(7));  // > timeout + grace (5 s)
  } else {
    std::vector<float> x(1 << 16, 1.0f);
    const absl::Time start = absl::Now();
    absl::Status s =
        AllReduceSync(**comm, x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum);
    const absl::Duration took = absl::Now() - start;
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    const std::string m(s.message());
    EXPECT_NE(m.find(absl::StrCat("rank ", world_rank, ": MPI AllReduce #0 (count=65536 float sum)")),
              std::string::npos) << m;
    EXPECT_NE(m.find(absl::StrCat("post-mortem: rank ", stalled, " did not report")),
              std::string::npos) << m;
    EXPECT_GE(took, absl::Milliseconds(500));
    EXPECT_LT(took, absl::Milliseconds(6500));
    EXPECT_EQ((*comm)->Barrier().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  // Nobody may still be using the store when rank 0 stops the server.
  MPI_Barrier(MPI_COMM_WORLD);
}

// On ranks other than 0, print only failures, prefixed with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  const int rank_;
};

}  // namespace
}  // namespace fusebox::comm

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  absl::Status s = fusebox::comm::InitMpi(&argc, &argv);
  if (!s.ok()) {
    std::fprintf(stderr, "InitMpi: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new fusebox::comm::FailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  // Every rank exits non-zero if any rank failed.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  fusebox::comm::FinalizeMpi();
  return worst;
}
