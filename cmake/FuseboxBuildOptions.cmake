# Compile and link options for fusebox's own targets only.
#
# fusebox_build_options is an INTERFACE target that every library,
# executable and test defined in this project links PRIVATE (through
# $<BUILD_INTERFACE:...>, so that it never appears in the installed export and
# static libraries do not ask consumers for it). Its options therefore reach
# fusebox's own compilations and never a consumer's (find_package or
# add_subdirectory). It carries the warnings, and in fuzz builds the
# instrumentation that tests/fuzz/CMakeLists.txt adds to it.
#
# No optimisation levels: the build type decides (CMAKE_BUILD_TYPE, or the
# presets in CMakePresets.json). The one exception is fusebox_vectorize below.

add_library(fusebox_build_options INTERFACE)
target_compile_options(fusebox_build_options INTERFACE -Wall -Wextra -Wno-unused-parameter)

# fusebox_targets_in(<out-var> <dir> <type-regex>): the targets defined in
# <dir> and its subdirectories whose TYPE matches <type-regex>.
function(fusebox_targets_in out dir types)
  set(_found "")
  get_property(_targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_t IN LISTS _targets)
    get_target_property(_type ${_t} TYPE)
    if(_type MATCHES "${types}")
      list(APPEND _found ${_t})
    endif()
  endforeach()
  get_property(_subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(_d IN LISTS _subdirs)
    fusebox_targets_in(_below "${_d}" "${types}")
    list(APPEND _found ${_below})
  endforeach()
  set(${out} "${_found}" PARENT_SCOPE)
endfunction()

# fusebox_apply_build_options(<dir>): links fusebox_build_options PRIVATE into
# every compiled target defined in <dir> and its subdirectories. Called once,
# at the end of the top-level CMakeLists.txt, so that a target added anywhere
# gets the project's warnings without remembering to ask for them.
function(fusebox_apply_build_options dir)
  fusebox_targets_in(_targets "${dir}"
                     "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
  foreach(_t IN LISTS _targets)
    target_link_libraries(${_t} PRIVATE $<BUILD_INTERFACE:fusebox_build_options>)
  endforeach()
endfunction()

# fusebox_vectorize(<target>): for the libraries whose hot loops are the
# element-wise reductions (comm/reduce.h documents them as auto-vectorised)
# and the copies into and out of fusebox buffers. GCC 12's -O2
# (RelWithDebInfo, what scripts/build.sh builds) uses the "very-cheap"
# vectoriser cost model, which vectorises no loop that needs a scalar
# epilogue: none of the 28 kernels in comm/reduce.cc (an in-cache float sum
# measured about 3x slower than at -O3). These targets used to force -O3 for
# that, overriding Debug builds too; the dynamic cost model vectorises the
# same loops at -O2 as -O3 does and does nothing at -O0/-O1, so the build
# type still decides. PRIVATE, GCC only (clang vectorises at -O2 already),
# never exported.
function(fusebox_vectorize target)
  target_compile_options(${target} PRIVATE $<$<CXX_COMPILER_ID:GNU>:-fvect-cost-model=dynamic>)
endfunction()

# fusebox_test_code_options(<dir>): the test programs defined in <dir> and its
# subdirectories compile at -O1 with line tables only (-g1) in optimised
# builds, whatever the build type asks of the libraries. Their TEST bodies,
# not the code under test, are where a build's time went: on 2 cores they
# were 456 of the main build's 1278 s of compile time at -O2 -g, and the
# slowest of them (tests/autotune/policy_cache_test.cc) compiles in 14 s at
# -O1 -g1 against 26 s. The libraries they test keep the build type's level,
# so what runs under test is what ships; a failing test's backtrace still has
# files and lines. Debug builds are left as they are.
# Under ASan and UBSan (FUSEBOX_SANITIZE address and/or undefined) the test
# programs' own code is not instrumented either: that took the compile of
# policy_cache_test.cc from 12 to 37 s and engine_test.cc from 7 to 22 s.
# Every library they test is, and so is the allocator (the runtime is linked
# into every test), so an overrun of a buffer a test allocated is still
# reported where fusebox's code makes it; what is no longer checked is the
# tests' own arithmetic and accesses, and library code from headers where a
# test program instantiates or inlines it (templates, inline functions).
# ThreadSanitizer is left on: code it cannot see synchronises threads it then
# reports as racing.
function(fusebox_test_code_options dir)
  fusebox_targets_in(_targets "${dir}" "^EXECUTABLE$")
  foreach(_t IN LISTS _targets)
    target_compile_options(${_t} PRIVATE
      "$<$<CONFIG:RelWithDebInfo>:-O1;-g1>" "$<$<CONFIG:Release,MinSizeRel>:-O1>")
    if(FUSEBOX_SANITIZE MATCHES "address|undefined")
      target_compile_options(${_t} PRIVATE -fno-sanitize=${FUSEBOX_SANITIZE})
    endif()
  endforeach()
endfunction()
