#!/usr/bin/env bash
# Makes sure a Debian machine has what tailbatch's build needs. Run as root it installs
# what is missing with apt-get; otherwise it prints the exact apt-get line and fails.
#
#   scripts/deps.sh          the build: compilers, CMake, Catch2, fmt, Google Benchmark, ...
#   scripts/deps.sh --test   and what the tests drive: Prometheus, curl, wrk, chromium, Node
#                            and the test folders' npm packages (npm ci, pinned by their
#                            package-lock.json)
#   scripts/deps.sh --all    and libtorch (libtorch-dev, about 150 packages) for the runtime
#                            example under examples/libtorch/
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case $mode in
  ""|--test|--all) ;;
  *) echo "usage: scripts/deps.sh [--test|--all]" >&2; exit 2 ;;
esac

# libboost-dev (Beast/Asio, header-only) and nlohmann-json3-dev build the example server
# tailbatch-serve; the core library needs none of these.
packages=(cmake ninja-build g++ clang catch2 libfmt-dev libbenchmark-dev libcli11-dev
          libboost-dev nlohmann-json3-dev)
if [[ $mode == --test || $mode == --all ]]; then
  packages+=(prometheus)        # ships promtool, which checks the Prometheus exposition
  packages+=(curl python3 wrk)  # tailbatch-serve's end-to-end test and benchmarks/server/run.sh
  packages+=(chromium libjs-chart.js)  # the /dashboard browser test; Chart.js draws its charts
  packages+=(yamllint)          # the Kubernetes manifests' ctest (deploy/kubernetes/)
  # Node runs the tests written against official clients (the openai SDK) and schemas; the
  # machine's own Node (20 or newer) serves, else Debian's.
  command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
fi
if [[ $mode == --all ]]; then
  packages+=(libtorch-dev)      # examples/libtorch/: a real runtime behind a Pipeline
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# The npm packages of every test folder that pins them (package.json with its lock file),
# installed exactly as locked; again only when the lock file is newer than the install.
npm_ci() {
  [[ $mode == --test || $mode == --all ]] || return 0
  local lock dir
  while IFS= read -r lock; do
    dir=$(dirname "$lock")
    if [[ ! -f $dir/node_modules/.package-lock.json || $lock -nt $dir/node_modules/.package-lock.json ]]; then
      echo "npm ci in $dir"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
  done < <(find tests -name package-lock.json -not -path '*/node_modules/*' | sort)
}

if [[ ${#missing[@]} -eq 0 ]]; then
  npm_ci
  exit 0
fi

line="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -ne 0 ]]; then
  echo "tailbatch needs these Debian packages: ${missing[*]}" >&2
  echo "install them as root, then run this again:" >&2
  echo "  sudo sh -c '$line'" >&2
  exit 1
fi
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
npm_ci
