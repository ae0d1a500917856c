"""The timeline of one step as a small PNG, from a trace of ``hwplace run --trace`` (the README's picture).

A row per worker (its group and rank, as Perfetto names the tracks), the spans of one step of the most often
called group method (the trainer's ``step``: the ``--step``-th call of its rank 0, the middle one by default)
drawn as bars coloured by category (a group call, a wait, a turn, offload and onload, a weight sync, the time
between calls), nested spans as thinner bars inside the ones they nest in; a time axis in milliseconds.
Needs Pillow (``pip install pillow``), which hwplace itself does not.

Run: python benchmarks/timeline_png.py run.json step.png [--step N] [--width 900]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

COLOURS = {"call": (66, 133, 244), "wait": (234, 67, 53), "turn": (52, 168, 83), "memory": (251, 188, 5),
           "sync": (155, 81, 224), "idle": (200, 200, 200)}
LEGEND = {"call": "group call (compute)", "wait": "wait", "turn": "turn", "memory": "offload / onload",
          "sync": "weight sync", "idle": "between calls"}
ROW, LABEL, TOP = 22, 150, 40


def step_window(trace: dict[str, Any], step: int | None = None) -> tuple[str, float, float]:
    """The name, start and end (µs) of one call of the most often called group method on one track."""
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "call"]
    counts = Counter((e["name"], e["pid"], e["tid"]) for e in spans)
    (name, pid, tid), count = max(counts.items(), key=lambda item: (item[1], -item[0][2]))
    calls = sorted((e["ts"], e["ts"] + e["dur"]) for e in spans if (e["name"], e["pid"], e["tid"]) == (name, pid, tid))
    index = min(max(1, step or count // 2), count) - 1
    return name, calls[index][0], calls[index][1]


def render(trace: dict[str, Any], out: Path, step: int | None = None, width: int = 900,
           title: str = "") -> tuple[str, float]:
    """Draw one step into ``out`` (PNG) under ``title``; returns the method and the step's length in seconds."""
    name, start, end = step_window(trace, step)
    margin = 0.04 * (end - start)
    low, high = start - margin, end + margin
    tracks = trace["otherData"]["hwplace"]["tracks"]
    keys = sorted((k for k, t in tracks.items() if t.get("main", True)),
                  key=lambda k: (tracks[k]["group"] != "trainer", tracks[k]["group"], tracks[k]["rank"]))
    height = TOP + ROW * len(keys) + 50
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    scale = (width - LABEL - 10) / (high - low)

    def x(ts: float) -> float:
        return LABEL + (min(max(ts, low), high) - low) * scale

    draw.text((10, 8), f"{title or 'one ' + name} ({(end - start) / 1e3:.0f} ms), a row per worker", "black", font)
    for row, key in enumerate(keys):
        y = TOP + row * ROW
        track = tracks[key]
        draw.text((10, y + 4), f"{track['group']} rank {track['rank']}", "black", font)
        pid, tid = (int(part) for part in key.split(":"))
        mine = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == pid and e.get("tid") == tid
                and e["ts"] < high and e["ts"] + e["dur"] > low]
        depth: list[tuple[float, float]] = []  # the spans that enclose the one drawn now
        for e in sorted(mine, key=lambda e: (e["ts"], -e["dur"])):
            s, f = e["ts"], e["ts"] + e["dur"]
            depth = [d for d in depth if d[0] <= s and f <= d[1]]
            inset = min(2 + 4 * len(depth), ROW // 2 - 2)
            depth.append((s, f))
            left, right = x(s), max(x(f), x(s) + 1)
            draw.rectangle((left, y + inset, right, y + ROW - 2 - inset), fill=COLOURS.get(e.get("cat", ""), "black"))
    axis = TOP + ROW * len(keys) + 4
    draw.line((LABEL, axis, width - 10, axis), "black")
    tick = _tick((high - low) / 1e3)
    t = 0.0
    while start + t * 1e3 <= high:
        draw.line((x(start + t * 1e3), axis, x(start + t * 1e3), axis + 4), "black")
        draw.text((x(start + t * 1e3) - 8, axis + 6), f"{t:.0f} ms", "black", font)
        t += tick
    legend_x = 10
    for category, label in LEGEND.items():
        draw.rectangle((legend_x, height - 16, legend_x + 10, height - 6), fill=COLOURS[category])
        draw.text((legend_x + 14, height - 18), label, "black", font)
        legend_x += 24 + int(draw.textlength(label, font))
    image.convert("P", palette=Image.Palette.ADAPTIVE, colors=32).save(out, optimize=True)
    return name, (end - start) / 1e6


def _tick(span_ms: float) -> float:
    for tick in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
        if span_ms / tick <= 8:
            return float(tick)
    return 10000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--step", type=int, help="which call (from 1); the middle one by default")
    parser.add_argument("--width", type=int, default=900)
    parser.add_argument("--title", default="", help="the picture's title (default: one METHOD)")
    args = parser.parse_args()
    name, seconds = render(json.loads(args.trace.read_text()), args.png, args.step, args.width, args.title)
    print(f"{args.png}: one {name} ({1e3 * seconds:.0f} ms), {args.png.stat().st_size} bytes")


if __name__ == "__main__":
    main()
