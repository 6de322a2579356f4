# Shared by the benchmark scripts that run tailbatch-serve (source it, do not run it):
# a temporary folder, a server started on an ephemeral 127.0.0.1 port and waited on until
# /readyz answers 200, stopped with SIGTERM, and wrk's latency lines read in milliseconds.
#
# Before sourcing, set `server` to the tailbatch-serve binary. After sourcing:
#   $work                   a temporary folder, removed on exit (with the server stopped)
#   $work/post.lua          wrk's script for POST /v1/classify with one short text
#   start_server [FLAGS...] starts $server --port 0 FLAGS... $SERVE_ARGS; sets $pid, $port
#   stop_server             SIGTERM, then waits; fails the script if the server exited non-zero
#   to_ms VALUE             "1.23ms", "830.00us", "1.20s" -> milliseconds
#   wrk_ms PCT FILE         wrk's "99%  1.23ms" line of FILE in milliseconds

for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "$0 needs $tool (scripts/deps.sh --test installs it)" >&2; exit 1; }
done
[[ -x ${server:-} ]] || { echo "no server at ${server:-}: build the tailbatch-serve target first" >&2; exit 1; }

work=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"text": "a great, moving film with a brilliant script and superb acting"}'
LUA

start_server() {
  "$server" --port 0 "$@" ${SERVE_ARGS:-} >"$work/out" 2>"$work/err" &
  pid=$!
  for _ in $(seq 200); do
    [[ -s $work/out ]] && break
    sleep 0.05
  done
  port=$(sed -n 's/^listening on 127\.0\.0\.1:\([0-9]*\).*$/\1/p' "$work/out" | head -1)
  [[ -n $port ]] || { echo "server did not start:" >&2; cat "$work/err" >&2; exit 1; }
  for _ in $(seq 400); do
    [[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz") == 200 ]] && return
    sleep 0.05
  done
  echo "server never became ready" >&2
  exit 1
}

stop_server() {
  kill -TERM "$pid"
  wait "$pid" || { echo "server exited non-zero" >&2; exit 1; }
  pid=
}

to_ms() {
  awk -v v="$1" 'BEGIN {u=v; gsub(/[0-9.]/, "", u); sub(/[a-z]+$/, "", v);
    if (u == "us") v /= 1000; else if (u == "s") v *= 1000; else if (u == "m") v *= 60000; printf "%.2f", v}'
}

wrk_ms() {
  to_ms "$(awk -v p="$1" '$1 == p {print $2; exit}' "$2")"
}
