"""Unit tests of the project itself: the chart, the image, the docs, the benches, the build,
the import rules."""
