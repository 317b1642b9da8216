"""Signal collectors. Each returns samples keyed by the names of `policies.Signals` fields, with the time
each was sampled; a value that could not be read is absent (never zero), and the error is reported."""
