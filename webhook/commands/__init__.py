"""The commands a person runs: `configpin serve`, `render`, `status`, `plan`/`approve` (changes),
`dashboard`, and the command line that dispatches them (cli)."""
