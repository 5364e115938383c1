"""Unit tests of the commands a person runs (webhook/commands): render, status."""
