"""Kubernetes I/O: the client, cluster state, the scale subresource, the warm pool, events, the Lease.

All API calls go through `client.Kube`, so tests fake at that seam or run a real apiserver."""
