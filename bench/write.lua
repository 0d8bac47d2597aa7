-- PUT /v1/memory/bench/k<N> as the researcher: owner writes over 1000 keys
-- per connection thread (creates, then updates), each recorded.
local n = 0
local token = "Bearer " .. os.getenv("WARDEN_TOKEN")

function request()
  n = n + 1
  local path = "/v1/memory/bench/k" .. (n % 1000)
  local body = '{"value": {"n": ' .. n .. ', "note": "load test"}, "visibility": "children"}'
  return wrk.format("PUT", path, {["Authorization"] = token, ["Content-Type"] = "application/json"}, body)
end
