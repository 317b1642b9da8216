"""The KEDA external scaler: a gRPC server (package `externalscaler`) publishing the decided replicas."""
