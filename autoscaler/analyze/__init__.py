"""`autoscaler analyze`: the demand-model preflight (the four questions, and the policy they lead to)."""
