"""The test harness: a real control plane (etcd, kube-apiserver, kube-controller-manager),
configpin run as a process against it, the chart rendered by Helm's own library, and plain
manifests. Shared by tests/ and bench/."""
