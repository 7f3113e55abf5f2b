# Installs fusebox as a CMake package (included at the end of the top-level
# CMakeLists.txt, once every target exists):
#
#   include/fusebox/config.h                generated configuration header
#   include/fusebox/{comm,bucketing,autotune,plugins/torch}/...h
#   lib/libfusebox_*.a                      the exported libraries
#   lib/cmake/fusebox/fusebox-config.cmake  find_package(fusebox CONFIG)
#   lib/cmake/fusebox/fusebox-config-version.cmake
#   lib/cmake/fusebox/fusebox-targets*.cmake
#   lib/pkgconfig/fusebox.pc
#   bin/fusebox-run, fusebox-profile, fusebox-tune, fusebox-cache (tools/)
#
# Installed targets are fusebox::<EXPORT_NAME>. Their include directories are
# include/fusebox (fusebox's headers include each other as "comm/types.h")
# and include ("fusebox/config.h"), both from fusebox::config.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FUSEBOX_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/fusebox
    CACHE STRING "Where fusebox-config.cmake is installed (relative to the prefix)")
mark_as_advanced(FUSEBOX_INSTALL_CMAKEDIR)
set(_fusebox_incdir ${CMAKE_INSTALL_INCLUDEDIR}/fusebox)

# --- libraries ------------------------------------------------------------------
# What users link (fusebox::comm, comm_backends, bucketing, autotune, torch)
# and every library those link, publicly or (static archives) privately:
# fusebox::config and the backends behind fusebox::comm_backends. The
# launcher, CLI and perf libraries are the tools' own and are not installed.
set(FUSEBOX_EXPORTED_TARGETS fusebox_config fusebox_comm fusebox_comm_testing)
foreach(_b ucx mpi nccl)
  if(TARGET fusebox_comm_${_b})
    list(APPEND FUSEBOX_EXPORTED_TARGETS fusebox_comm_${_b})
  endif()
endforeach()
list(APPEND FUSEBOX_EXPORTED_TARGETS fusebox_comm_backends fusebox_bucketing fusebox_autotune)
if(TARGET fusebox_torch)
  list(APPEND FUSEBOX_EXPORTED_TARGETS fusebox_torch)
endif()

install(TARGETS ${FUSEBOX_EXPORTED_TARGETS}
  EXPORT fusebox-targets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT fusebox-targets
  NAMESPACE fusebox::
  FILE fusebox-targets.cmake
  DESTINATION ${FUSEBOX_INSTALL_CMAKEDIR})

# --- headers --------------------------------------------------------------------
install(FILES ${PROJECT_BINARY_DIR}/generated/fusebox/config.h DESTINATION ${_fusebox_incdir})
# comm/, less the headers of backends this build does not have.
set(_fusebox_comm_excludes)
foreach(_b ucx mpi nccl)
  if(NOT TARGET fusebox_comm_${_b})
    list(APPEND _fusebox_comm_excludes PATTERN ${_b} EXCLUDE)
  endif()
endforeach()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/comm/ DESTINATION ${_fusebox_incdir}/comm
  FILES_MATCHING PATTERN "*.h" ${_fusebox_comm_excludes})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/bucketing/ DESTINATION ${_fusebox_incdir}/bucketing
  FILES_MATCHING PATTERN "*.h")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/autotune/ DESTINATION ${_fusebox_incdir}/autotune
  FILES_MATCHING PATTERN "*.h" PATTERN profiles EXCLUDE)
if(TARGET fusebox_torch)
  # The plugin's own headers only (not compat_include/, python/, examples/).
  file(GLOB _fusebox_torch_headers ${PROJECT_SOURCE_DIR}/plugins/torch/*.h)
  install(FILES ${_fusebox_torch_headers} DESTINATION ${_fusebox_incdir}/plugins/torch)
endif()

# --- fusebox-config.cmake, fusebox-config-version.cmake -------------------------
configure_package_config_file(
  ${PROJECT_SOURCE_DIR}/cmake/fusebox-config.cmake.in
  ${PROJECT_BINARY_DIR}/package/fusebox-config.cmake
  INSTALL_DESTINATION ${FUSEBOX_INSTALL_CMAKEDIR}
  NO_SET_AND_CHECK_MACRO)
write_basic_package_version_file(
  ${PROJECT_BINARY_DIR}/package/fusebox-config-version.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${PROJECT_BINARY_DIR}/package/fusebox-config.cmake
  ${PROJECT_BINARY_DIR}/package/fusebox-config-version.cmake
  DESTINATION ${FUSEBOX_INSTALL_CMAKEDIR})

# --- fusebox.pc -----------------------------------------------------------------
# Best effort, for builds that do not use CMake. The libraries are static
# archives by default: Requires names what fusebox's headers include (Abseil,
# nlohmann_json), Requires.private / Libs.private what only the archives need
# at link time (UCX, MPI, CUDA/NCCL, threads): link with
# `pkg-config --static --libs fusebox`. fusebox::torch is left out (LibTorch
# has no pkg-config file): use find_package(fusebox) for it.
set(_pc_libs "")
foreach(_t fusebox_autotune fusebox_bucketing fusebox_comm_backends fusebox_comm_ucx
           fusebox_comm_mpi fusebox_comm_nccl fusebox_comm_testing fusebox_comm)
  if(TARGET ${_t})
    string(APPEND _pc_libs " -l${_t}")
  endif()
endforeach()
set(_pc_requires
  "absl_status absl_statusor absl_strings absl_str_format absl_time absl_span"
  "absl_flat_hash_map absl_synchronization nlohmann_json")
string(JOIN " " FUSEBOX_PC_REQUIRES ${_pc_requires})
set(FUSEBOX_PC_REQUIRES_PRIVATE "absl_flat_hash_set")
set(FUSEBOX_PC_LIBS_PRIVATE "-pthread")
if(TARGET fusebox_comm_ucx)
  string(APPEND FUSEBOX_PC_REQUIRES_PRIVATE " ucx")
endif()
if(TARGET fusebox_comm_mpi)
  # FindMPI does not always say whose MPI it found: the library path does.
  if(MPI_C_LIBRARY_VERSION_STRING MATCHES "Open MPI" OR MPI_C_LIBRARIES MATCHES "/openmpi/")
    string(APPEND FUSEBOX_PC_REQUIRES_PRIVATE " ompi-c")
  elseif(MPI_C_LIBRARY_VERSION_STRING MATCHES "MPICH" OR MPI_C_LIBRARIES MATCHES "/mpich/")
    string(APPEND FUSEBOX_PC_REQUIRES_PRIVATE " mpich")
  else()
    foreach(_l IN LISTS MPI_C_LIBRARIES)
      string(APPEND FUSEBOX_PC_LIBS_PRIVATE " ${_l}")
    endforeach()
  endif()
endif()
if(TARGET fusebox_comm_nccl)
  string(APPEND FUSEBOX_PC_LIBS_PRIVATE " ${NCCL_LIBRARY} ${CUDA_cudart_LIBRARY}")
endif()
if(FUSEBOX_SANITIZE)
  string(APPEND FUSEBOX_PC_LIBS_PRIVATE " -fsanitize=${FUSEBOX_SANITIZE}")
endif()
string(STRIP "${_pc_libs}" FUSEBOX_PC_LIBS)
# Relocatable: the prefix is found from the .pc file's own directory.
file(RELATIVE_PATH FUSEBOX_PC_PREFIX_FROM_PCDIR
     /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" FUSEBOX_PC_PREFIX_FROM_PCDIR "${FUSEBOX_PC_PREFIX_FROM_PCDIR}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/fusebox.pc.in ${PROJECT_BINARY_DIR}/package/fusebox.pc
               @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/fusebox.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
