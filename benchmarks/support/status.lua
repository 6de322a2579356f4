-- wrk script: POST /v1/classify with one short text; counts the answers by status and
-- measures the latency of the 2xx answers alone (each request carries its send time, in
-- microseconds of CLOCK_MONOTONIC, as its X-Request-Id, which tailbatch-serve echoes).
-- Prints "status CODE:N ...", "2xx_rps", "2xx_p50_ms", "2xx_p90_ms", "2xx_p99_ms" at the end.
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } tb_timespec;
int clock_gettime(int clk, tb_timespec* ts);
]]
local ts = ffi.new("tb_timespec")
local function now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
end
local body = '{"text": "a great, moving film with a brilliant script and superb acting"}'
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  codes = {}
  lat = {}   -- 2xx latency, 0.1 ms buckets
  ok = 0
end
function request()
  return wrk.format("POST", nil, {["Content-Type"] = "application/json", ["X-Request-Id"] = tostring(now_us())}, body)
end
function response(status, headers, b)
  codes[status] = (codes[status] or 0) + 1
  if status >= 200 and status < 300 then
    local sent = tonumber(headers["x-request-id"])
    if sent then
      local k = math.floor((now_us() - sent) / 100)
      lat[k] = (lat[k] or 0) + 1
      ok = ok + 1
    end
  end
end
function done(summary, latency, requests)
  local all, hist, n = {}, {}, 0
  for _, t in ipairs(threads) do
    for c, v in pairs(t:get("codes")) do all[c] = (all[c] or 0) + v end
    for k, v in pairs(t:get("lat")) do hist[k] = (hist[k] or 0) + v; n = n + v end
  end
  local secs = summary.duration / 1e6
  local line = ""
  for c, v in pairs(all) do line = line .. string.format(" %d:%d", c, v) end
  io.write(string.format("status%s\n", line))
  io.write(string.format("2xx_rps %.1f\n", (all[200] or 0) / secs))
  local keys = {}
  for k in pairs(hist) do table.insert(keys, k) end
  table.sort(keys)
  for _, p in ipairs({50, 90, 99}) do
    local want, acc, val = n * p / 100, 0, 0
    for _, k in ipairs(keys) do acc = acc + hist[k]; if acc >= want then val = (k + 1) / 10; break end end
    io.write(string.format("2xx_p%d_ms %.1f\n", p, val))
  end
end
