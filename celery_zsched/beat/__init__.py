"""beat."""
