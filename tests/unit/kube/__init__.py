"""Unit tests of cluster access (webhook/kube) against in-memory or local servers."""
