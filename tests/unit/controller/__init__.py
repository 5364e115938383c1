"""Unit tests of the controller (webhook/controller): index, queue, leadership, re-stamps,
waves, preview."""
