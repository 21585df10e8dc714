"""Dated studies: one folder each, script + README + result (bench/README.md)."""
