#!/usr/bin/env bash
# Builds and runs tailbatch's main demo. The README's first command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset default >/dev/null
demo=before_after_demo
cmake --build --preset default --target "$demo"
exec ./build/default/examples/"$demo" "$@"
