-- POST /v1/sops/validate as the researcher: a two-step preflight (the lab's
-- valid report SOP), every step's decision recorded.
wrk.method = "POST"
wrk.path = "/v1/sops/validate"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("WARDEN_TOKEN")
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[{"sop": {"sop_id": "prepare-report", "version": 1, "steps": [
  {"step_id": "summarize", "action": "document.summarize", "arguments": {"document_id": "fixture-1"}},
  {"step_id": "save", "action": "artifact.save", "arguments": {"path": "internal/report.txt"}}]}}]]
