#!/usr/bin/env bash
# Makes sure a Debian machine has what tailbatch's build needs. Run as root it installs
# what is missing with apt-get; otherwise it prints the exact apt-get line and fails.
set -euo pipefail

# libboost-dev (Beast/Asio, header-only) and nlohmann-json3-dev build the example server
# tailbatch-serve; the core library needs none of these.
packages=(cmake ninja-build g++ clang catch2 libfmt-dev libbenchmark-dev libcli11-dev
          libboost-dev nlohmann-json3-dev)
if [[ "${1:-}" == "--test" ]]; then
  packages+=(prometheus)        # ships promtool, which checks the Prometheus exposition
  packages+=(curl python3 wrk)  # tailbatch-serve's end-to-end test and benchmarks/server/run.sh
  packages+=(chromium libjs-chart.js)  # the /dashboard browser test; Chart.js draws its charts
  packages+=(yamllint)          # the Kubernetes manifests' ctest (deploy/kubernetes/)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

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
