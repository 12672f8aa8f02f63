"""Built-in projection types."""
