"""Unit tests of certificates and cipher suites (webhook/tls)."""
