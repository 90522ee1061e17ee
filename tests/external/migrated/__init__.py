"""FastMCP 3.x servers of our own, in the shapes of two public ones, moved to mrtr by their decorators and imports."""
