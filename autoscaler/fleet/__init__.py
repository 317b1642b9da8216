"""The fleet controller: many ModelAutoscaler objects served by one process (and sharded over several)."""
