"""The decision core: pure functions over plain dicts. No I/O, no clock, no cluster client."""
