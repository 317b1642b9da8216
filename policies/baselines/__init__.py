"""Faithful baselines with the same interface as the predictive policy:
`decide(spec, state, signals, now) -> (Decision, state)`.

They are what users run today (Kubernetes HPA, Knative KPA, KEDA's Prometheus scaler), a static peak
allocation, and a clairvoyant reference that knows the future and pays only the unavoidable warm-up."""
