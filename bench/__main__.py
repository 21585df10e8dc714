"""The benchmarks' one entry point, as ``vllm bench serve|latency|throughput``:

    python -m bench serve --scenario SCENARIO [ARGS]   # a server under load (SCENARIO below)
    python -m bench cost [ARGS]                        # what a request costs, streamed vs whole
    python -m bench gpu [ARGS]                         # the GPU check (make gpu-check; --device cpu --quick)

Scenarios of ``serve``: run (the headline suite, make bench), admission, abuse (make bench-abuse),
priority (make bench-priority), ws (WebSocket vs POST time to first audio), soak (memory under
mixed traffic), loadtest (locust, make loadtest). ARGS go to the scenario or command:
``python -m bench serve --scenario admission --help`` lists its own. bench/README.md has them all,
and the suites that left the tree with the commit to run each from.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SCENARIOS = {"run": "bench.run", "admission": "bench.admission", "abuse": "bench.abuse", "priority": "bench.priority",
             "ws": "bench.ws_ttfa", "soak": "bench.soak", "loadtest": "bench.loadtest"}
COMMANDS = {"cost": "bench.cost", "gpu": "bench.gpu_check"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = (argv[0], argv[1:]) if argv else (None, [])
    if name == "serve":
        scenario = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        scenario.add_argument("--scenario")
        known, rest = scenario.parse_known_args(rest)
        name = known.scenario
        module = SCENARIOS.get(name or "")
    else:
        module = COMMANDS.get(name or "")
    if module is None:
        asked = argv in (["-h"], ["--help"], ["serve", "-h"], ["serve", "--help"])
        print(__doc__, file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    prog, sys.argv[0] = sys.argv[0], f"python -m bench {'serve --scenario ' if name in SCENARIOS else ''}{name}"
    try:  # argparse names the program after sys.argv[0]
        return importlib.import_module(module).main(rest) or 0
    finally:
        sys.argv[0] = prog


if __name__ == "__main__":
    raise SystemExit(main())
