-- GET /v1/memory/project/client_region as the researcher: a nearest-visible
-- resolve through the hierarchy, recorded in the audit log.
wrk.method = "GET"
wrk.path = "/v1/memory/project/client_region"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("WARDEN_TOKEN")
