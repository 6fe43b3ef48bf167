"""Pure math: no hooks, no Lightning, no files."""
