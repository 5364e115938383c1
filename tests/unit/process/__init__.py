"""Unit tests of settings and metrics (webhook/process)."""
