-- POST /v1/sessions/bench-<thread>/calls as the AgentDojo banking agent:
-- a `send_money` whose recipient a provenance rule guards, in a session
-- holding 64 KiB of recorded results; every call a new call id, decided
-- and recorded (one compare-and-set of the session row with its audit
-- entry). One session per wrk thread, so run one connection per thread.
local counter = 0
local threads = {}

function setup(thread)
  thread:set("id", counter)
  table.insert(threads, thread)
  counter = counter + 1
end

local token = "Bearer " .. os.getenv("WARDEN_TOKEN")
local iban = os.getenv("WARDEN_IBAN")
local n = 0

function request()
  n = n + 1
  local path = "/v1/sessions/bench-" .. id .. "/calls"
  local body = '{"call_id": "c' .. n .. '", "action": "send_money", "arguments": '
    .. '{"recipient": "' .. iban .. '", "amount": 10, "subject": "rent", "date": "2022-04-01"}}'
  return wrk.format("POST", path, {["Authorization"] = token, ["Content-Type"] = "application/json"}, body)
end
