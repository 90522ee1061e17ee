"""Development tools for mrtr's own checks (not part of the package)."""
