# Shared by the wrk benchmark scripts of tailbatch-serve (benchmarks/server/): source it
# with the script's own arguments, `[SERVER] [SECONDS] [CONNECTIONS...]`, before serve.sh.
#
# Before sourcing, set `default_conns` (an array). After sourcing:
#   $server   tailbatch-serve to run (default: build/default/examples/tailbatch-serve)
#   $seconds  wrk run per row (default 10)
#   $conns    the connection counts given, else default_conns (an array)

server=${1:-build/default/examples/tailbatch-serve}
seconds=${2:-10}
shift $(($# > 2 ? 2 : $#)) || true
conns=("$@")
if [[ ${#conns[@]} -eq 0 ]]; then conns=("${default_conns[@]}"); fi
