"""configpin's benchmarks, one module each, run from the checkout as
`.venv/bin/python -m bench.<name> [options]` (bench/README.md: what each measures, against
what, and its latest figures). What several of them share is in `bench.common`; the control
plane, configpin as a process and the manifests come from `harness`."""
