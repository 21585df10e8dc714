"""The benchmarks' shared library and the suites' parts (bench/README.md)."""
