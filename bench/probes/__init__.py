"""Probes: instruments that tests and the GPU check import (bench/README.md)."""
