"""Scale tools: the coordinate check of a parametrization (width and depth), in-process and fast."""
