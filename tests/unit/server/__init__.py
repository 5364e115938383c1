"""Unit tests of the admission server (webhook/server): HTTP, limits, TLS, the workload and
source webhooks."""
