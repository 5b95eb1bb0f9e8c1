-- wrk script for bench/callback.py: POSTs pre-built signed callbacks, one line each
-- ("path<TAB>body"), thread i of n taking every n-th line; prints the figures as one line.
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end

function init(args)
  local file, nthreads = args[1], tonumber(args[2])
  reqs, idx, wrapped = {}, 0, 0
  local i = 0
  for line in io.lines(file) do
    if i % nthreads == tid then
      local tab = line:find("\t", 1, true)
      reqs[#reqs + 1] = wrk.format("POST", line:sub(1, tab - 1),
                                   {["Content-Type"] = "text/xml"}, line:sub(tab + 1))
    end
    i = i + 1
  end
end

function request()
  idx = idx + 1
  if idx > #reqs then
    idx, wrapped = 1, wrapped + 1
  end
  return reqs[idx]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("WRK n=%d us=%d p50=%d p99=%d non2xx=%d sockerr=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
