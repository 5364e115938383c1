"""What the process is set up with: its settings (config), logging, metrics, the allocator's
memory release, and the digest key read from a file."""
