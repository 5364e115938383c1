"""Objects read without a cluster: manifests read as kubectl reads them, and the sources
(ConfigMaps, Secrets) served from files (the embedded default)."""
