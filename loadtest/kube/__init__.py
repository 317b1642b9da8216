"""The Kubernetes side of the test environment: control plane, node provisioner, KEDA (built by build.sh)."""
