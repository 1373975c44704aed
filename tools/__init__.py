"""Scripts for people working on nodecheck (not installed)."""
