"""hwplace's CUDA paths on a real GPU, without installing hwplace: NVML detection, CUDA IPC device slots (also with
expandable segments), slot memory over 300 versions, the device digest on odd lengths, NCCL pairs on one GPU,
concurrent large sends, a peer killed mid-transfer, and the weight-sync transport decision (issue 26).

Each check runs in a fresh interpreter with a time limit (one that outlives it is reported ``hang`` and killed,
and the run goes on); the report, ``--out`` (default ./gpu_check.json), holds per check its status (pass, fail,
error, hang, skip), seconds and details, and the environment (torch, CUDA, NCCL, driver, GPUs, nvidia-smi -L).
Each check's output is kept beside it, in ``<out>_logs/``. Without a GPU (or with ``--cpu``) the checks that
have a stand-in run it (CPU slots through /dev/shm, gloo pairs) and the others are ``skip``. See
docs/backends/cuda.md, "Running the GPU check".

Run: python benchmarks/gpu_check.py [--out DIR/gpu_check.json] [--cpu] [--budget 400] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_checks import harness  # after this directory is on the path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON report's path")
    parser.add_argument("--cpu", action="store_true", help="run the CPU stand-ins only, even where there is a GPU")
    parser.add_argument("--budget", type=float, default=400.0, help="seconds for the whole run (checks past it "
                                                                    "are skipped)")
    parser.add_argument("--only", nargs="*", default=[], help="run only these checks")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the harness: run one check in this process
    parser.add_argument("--mode", choices=("gpu", "cpu"), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--environment", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    made = harness.SHIM_VARIABLE not in os.environ
    shim = harness.importable()
    if args.one:
        harness.run_one(args.one, args.mode == "gpu", args.result)
        return 0
    if args.environment:
        args.environment.write_text(json.dumps(harness.environment(), default=str, indent=1), encoding="utf-8")
        return 0
    unknown = sorted(set(args.only) - set(harness.load_checks()))
    if unknown:
        parser.error(f"unknown checks {unknown}; the checks are {list(harness.CHECKS)}")
    out = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        report = harness.orchestrate(out, args.cpu, args.budget, args.only)
    finally:
        if made:
            shutil.rmtree(shim, ignore_errors=True)  # the links only, not what they point to
    counts = ", ".join(f"{n} {s}" for s, n in report["counts"].items() if n)
    print(f"gpu_check ({report['mode']} mode, {report['seconds']} s): {counts}; report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
