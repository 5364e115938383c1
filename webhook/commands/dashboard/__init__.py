"""`configpin dashboard` (`kubectl configpin dashboard`): a local web page over the user's own
kubeconfig and rights, nothing installed in the cluster and no permission added.

- `guard`: the fence around a local server that holds the user's credentials (its own Host
  only, a token for every change, the response headers: a strict Content-Security-Policy).
- `feeds`: what the page shows, read with the user's rights: one list (and watch, where the
  user may) per resource type in the namespaces asked for; Secrets as metadata only.
- `views`: the pages' data, worked out from what the feeds hold (pure): changes and their
  waves as a timeline, who uses which key, the workloads.
- `app`: the routes (the page, its assets, the JSON the page reads and other tools may read),
  `http`: the server on loopback, `command`: the command line.

Like `configpin status`, it holds no digest key: it reads configpin's records (rollout
records, who changed and approved a source) and Events as they stand, and says so.
"""
