"""Unit tests of manifests read as kubectl reads them (webhook/inputs)."""
