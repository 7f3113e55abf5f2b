# Rendezvous stores: MemoryStore, PrefixStore, StoreAllGather, the TCP store,
# torchrun-style rendezvous and the timeout post-mortem over a store. All in-process (ranks as threads, loopback).
foreach(_t store tcp_store rendezvous fault)
  add_executable(${_t}_test ${_t}_test.cc)
  target_link_libraries(${_t}_test PRIVATE fusebox::comm GTest::gtest_main GTest::gmock)
  gtest_discover_tests(${_t}_test DISCOVERY_TIMEOUT 60)
endforeach()
