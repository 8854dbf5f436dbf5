# Shared by the quick-start scripts: install what is missing, pick a parallelism.
# Sourced, not run.

# ensure_packages PKG...: apt-get install the Debian packages that are not installed yet.
ensure_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "elastic: installing ${missing[*]}" >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What building and testing elastic needs, by Debian package name.
ELASTIC_BUILD_PACKAGES=(g++ cmake ninja-build libboost-dev libfmt-dev libcli11-dev libdw-dev)
ELASTIC_TEST_PACKAGES=(catch2 libbenchmark-dev procps etcd-server libcurl4-openssl-dev openssl libgloo-dev python3-yaml python3-jsonschema curl pkgconf
                       iproute2 clang libclang-rt-14-dev munge slurmctld slurmd slurm-client shellcheck chromium libtorch-dev
                       python3-torch python3-pip python3-setuptools libatomic1 radosgw ceph-mon ceph-osd ceph-common)

jobs() { nproc 2>/dev/null || echo 2; }

# build_release DIR TARGET...: a Release build of the programs a demo runs (no tests, no
# benchmarks) in DIR.
build_release() {
  local build="$1" src
  shift
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DELASTIC_BUILD_TESTS=OFF \
    -DELASTIC_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build "$build" --target "$@" -j "$(jobs)" >/dev/null
}
