-- PUT /v1/memory/bench/k<N> spread over many agents: request n is made with
-- the n-th token of WARDEN_TOKENS (comma-separated, one per agent), each
-- agent writing its own records over 100 keys (creates, then updates),
-- each write recorded.
local tokens = {}
for t in string.gmatch(os.getenv("WARDEN_TOKENS") or "", "[^,]+") do
  tokens[#tokens + 1] = "Bearer " .. t
end
local n = 0

function init(args)
  -- Threads start at different agents.
  n = math.random(0, #tokens - 1)
end

function request()
  n = n + 1
  local token = tokens[(n % #tokens) + 1]
  local path = "/v1/memory/bench/k" .. (math.floor(n / #tokens) % 100)
  local body = '{"value": {"n": ' .. n .. ', "note": "load test"}, "visibility": "children"}'
  return wrk.format("PUT", path, {["Authorization"] = token, ["Content-Type"] = "application/json"}, body)
end
