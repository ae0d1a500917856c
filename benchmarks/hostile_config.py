"""How fast hostile YAML is refused: deep nesting, alias bombs, huge integers, absurd sizes.

The tests (``tests/config/test_loading.py``) bound the work a refusal takes by counting function calls; this
script times the same inputs, which is where wall-clock figures belong (a loaded machine stretches them).

Run: python benchmarks/hostile_config.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hwplace import ConfigError, load_config

INPUTS = {
    "5,000 nested flow lists": "a: " + "[" * 5000 + "]" * 5000,
    "50,000 unclosed brackets": "a: " + "[" * 50000,
    "3,000 nested flow mappings": "a: " + "{b: " * 3000 + "}" * 3000,
    "500 nested block lists": "".join(f"{' ' * level}- \n" for level in range(500)),
    "alias bomb (9 levels of 9)": "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)),
    "a 100,000-digit integer": "n: " + "9" * 100_000,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{'input':<30} {'median ms':>10} {'max ms':>10}  outcome")
    with tempfile.TemporaryDirectory() as folder:
        for what, text in INPUTS.items():
            path = Path(folder) / "config.yaml"
            path.write_text(text)
            times, outcome = [], ""
            for _ in range(args.repeat):
                start = time.perf_counter()
                try:
                    load_config(path)
                    outcome = "loaded"
                except ConfigError as error:
                    outcome = str(error).splitlines()[0][len(str(path)):][:60]
                times.append((time.perf_counter() - start) * 1000)
            print(f"{what:<30} {statistics.median(times):>10.1f} {max(times):>10.1f}  {outcome}")


if __name__ == "__main__":
    main()
