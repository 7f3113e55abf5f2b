#!/usr/bin/env bash
# Gathers the Debian 12 (bookworm, amd64) packages that a GPU machine needs to
# build fusebox and lacks, for perf/gpu/run_kit.sh (perf/gpu/README.md):
#
#   bash perf/gpu/kit.sh [DIR]        (DIR: default gpu-kit/, git-ignored)
#
# Run it on a bookworm amd64 machine that reaches Debian's archive: it uses
# `apt-get download` (no root, nothing installed). The GPU machines lent to
# this project have CUDA, NCCL, PyTorch 2.x, CMake and pybind11 but not UCX,
# OpenMPI, Abseil, nlohmann-json or GoogleTest, and reach no registry, so the
# kit travels with the working tree (the device tool's `carry`; 64 MiB in
# all). The GPU build is configured without MPI (FUSEBOX_WITH_MPI=OFF: no GPU
# test, no GPU benchmark and nothing the torch plugin needs uses it), so the
# kit has no OpenMPI.
#
# KEEP is what goes in; DROP is every other package of the dependency closure
# of the roots (apt-cache depends --recurse, no recommends/suggests), each
# with why it is left out. A package in the closure that is in neither list
# stops the script: decide, then add it to one of them. The kit's total and
# the tree + kit total are printed; over 60 MiB fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-gpu-kit}
LIMIT_BYTES=$((60 * 1024 * 1024))

# The packages fusebox's configure asks for (CMakeLists.txt: find_package
# absl, nlohmann_json, GTest, ucx): the roots of the closure.
ROOTS=(libucx-dev libabsl-dev nlohmann-json3-dev libgtest-dev libgmock-dev)

declare -A KEEP=(
  [libucx-dev]="UCX headers, CMake config (find_package(ucx)), link-time .so symlinks"
  [libucx0]="UCX runtime: libucp/libucs/libuct/libucm and the transport modules (ucx/libuct_*.so.0)"
  [libnuma1]="NEEDED by libucs, libuct and libucp; not part of a CUDA/PyTorch image's guarantees"
  [libabsl-dev]="Abseil headers, CMake config (find_package(absl)), link-time .so symlinks"
  [libabsl20220623]="Abseil's shared libraries (what fusebox's binaries load)"
  [nlohmann-json3-dev]="nlohmann/json, header-only, and its CMake config"
  [libgtest-dev]="GoogleTest headers, prebuilt libgtest.a/libgtest_main.a, CMake config (GTest)"
  [libgmock-dev]="GoogleMock headers and libgmock.a (the tests link GTest::gmock)"
)

_base="the base system of any Debian/Ubuntu image (and nothing in KEEP links it)"
_rt="the C/C++ runtime: present wherever a compiler and PyTorch are"
_scripts="maintainer-script machinery: dpkg -x runs no scripts"
_rdma="only UCX's InfiniBand and RDMA-CM transport modules (ucx/libuct_ib.so.0, libuct_rdmacm.so.0) link it; UCX dlopens its modules and skips one that fails to load, and one machine needs shared memory and TCP only; on LD_LIBRARY_PATH it would shadow the image's own copy, which NCCL may load"
declare -A DROP=(
  [libc6]=$_rt [libgcc-s1]=$_rt [libstdc++6]=$_rt [gcc-12-base]=$_rt
  [zlib1g]=$_base [libzstd1]=$_base [liblzma5]=$_base [libbz2-1.0]=$_base [libmd0]=$_base
  [libacl1]=$_base [libselinux1]=$_base [libpcre2-8-0]=$_base [libaudit1]=$_base
  [libaudit-common]=$_base [libcap-ng0]=$_base [libcrypt1]=$_base [libdb5.3]=$_base
  [libpam0g]=$_base [libpam-modules]=$_base [libpam-modules-bin]=$_base
  [libsemanage2]=$_base [libsemanage-common]=$_base [libsepol2]=$_base [libtinfo6]=$_base
  [libreadline8]=$_base [readline-common]=$_base [libslang2]=$_base [libnewt0.52]=$_base
  [libtextwrap1]=$_base [libdebian-installer4]=$_base
  [debconf]=$_scripts [cdebconf]=$_scripts ["<debconf-2.0>"]=$_scripts [adduser]=$_scripts
  [passwd]=$_scripts [dpkg]=$_scripts [tar]=$_scripts [install-info]=$_scripts
  [googletest]="GoogleTest's sources (/usr/src/googletest); libgtest-dev already ships the built libraries its CMake config names"
  [libibverbs1]=$_rdma [librdmacm1]=$_rdma [ibverbs-providers]=$_rdma
  [libnl-3-200]=$_rdma [libnl-route-3-200]=$_rdma
)

die() { echo "kit.sh: $*" >&2; exit 1; }

{ command -v apt-get && command -v apt-cache; } >/dev/null ||
  die "needs apt-get and apt-cache (a Debian 12 machine that reaches Debian's archive)"
arch=$(dpkg --print-architecture)
# shellcheck disable=SC1091
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-unknown}")
[[ $arch == amd64 && $codename == bookworm ]] ||
  die "this machine is $codename/$arch; the kit must be Debian 12 (bookworm) amd64 packages"

# The closure, checked against KEEP and DROP.
mapfile -t closure < <(apt-cache depends --recurse --no-recommends --no-suggests \
  --no-conflicts --no-breaks --no-replaces --no-enhances "${ROOTS[@]}" | grep -v '^ ' | sort -u)
((${#closure[@]} > 0)) || die "apt-cache depends returned nothing: run apt-get update?"
unknown=()
for p in "${closure[@]}"; do
  [[ -n ${KEEP[$p]+x} || -n ${DROP[$p]+x} ]] || unknown+=("$p")
done
((${#unknown[@]} == 0)) ||
  die "the closure has packages in neither KEEP nor DROP: ${unknown[*]} (decide and list them)"
for p in "${!KEEP[@]}"; do
  printf '%s\n' "${closure[@]}" | grep -qxF "$p" ||
    die "$p is in KEEP but not in the closure of ${ROOTS[*]}: the archive changed, check the lists"
done

# Download into a fresh folder, then replace DIR's .deb files with it.
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.download.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mapfile -t keep < <(printf '%s\n' "${!KEEP[@]}" | sort)
echo "kit.sh: downloading ${#keep[@]} packages into $dir/"
# (_apt cannot write into a root-owned folder; apt then downloads as root and warns.)
(cd "$tmp"; apt-get download -q "${keep[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed') || true
for p in "${keep[@]}"; do
  compgen -G "$tmp/${p}_*.deb" >/dev/null || die "apt-get download did not fetch $p"
done
rm -f "$dir"/*.deb
mv "$tmp"/*.deb "$dir"/

# The manifest run_kit.sh prints: package, version, bytes, sha256, why.
{
  echo "# fusebox GPU kit: Debian $codename $arch, made $(date -u +%Y-%m-%dT%H:%M:%SZ) by perf/gpu/kit.sh"
  echo "# package version bytes sha256 -- why"
  for p in "${keep[@]}"; do
    f=$(ls "$dir/${p}"_*.deb)
    v=$(dpkg-deb -f "$f" Version)
    printf '%s %s %s %s -- %s\n' "$p" "$v" "$(stat -c %s "$f")" \
      "$(sha256sum "$f" | cut -d' ' -f1)" "${KEEP[$p]}"
  done
} >"$dir/MANIFEST.txt"

mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }
echo
printf '%-22s %-26s %10s\n' package version bytes
grep -v '^#' "$dir/MANIFEST.txt" | while read -r p v b _; do
  printf '%-22s %-26s %10s\n' "$p" "$v" "$b"
done
kit_bytes=$(find "$dir" -maxdepth 1 -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')
# What travels: tracked files and untracked ones git does not ignore.
# (A tracked file deleted in the work tree does not travel: stat skips it.)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
  { xargs -0 -r stat -c %s -- 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }')
total=$((kit_bytes + tree_bytes))
echo
echo "kit:        $kit_bytes bytes ($(mib "$kit_bytes")) in $dir/"
echo "tree:       $tree_bytes bytes ($(mib "$tree_bytes"))"
echo "tree + kit: $total bytes ($(mib "$total")); limit 60 MiB (the carry limit is 64 MiB)"
((total <= LIMIT_BYTES)) || die "tree + kit is over 60 MiB"
echo "kit.sh: done; carry \"$dir\" and run: bash perf/gpu/run_kit.sh $dir"
