"""Webhooks: a tenant's events pushed to its HTTPS endpoints (issue 40), signed by the Standard
Webhooks specification, at least once, in order per endpoint, retried with backoff, dead-lettered
after a bounded time, an endpoint disabled after sustained failure. The pure parts here
(`signing.py`, `endpoints.py`, `retries.py`); the shell that delivers is `sidecar.py`."""
