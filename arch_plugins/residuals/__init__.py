"""Built-in residual types."""
