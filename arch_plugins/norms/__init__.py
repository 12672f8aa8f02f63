"""Built-in norm strategies."""
