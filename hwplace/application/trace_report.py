"""``hwplace report FILE``: what a trace of ``hwplace run --trace`` says (SPEC §13).

Each device's idle share per stage, each worker's time in and between calls, the waits by worker and kind (where the
time goes: a bubble that recurs), the top waits (what held the run up: each wait's time beyond the usual wait of its
kind, a collective's charged to the rank its peers waited for) and the longest waits.

A worker computes while it is inside a group call (a ``call`` span) and not waiting in it (a ``wait`` span: a
channel, a turn, a weight version); a device is busy while any worker holding it computes. A stage is a group call
of a component (``trainer.step``), its time the union of that call's spans over the component's ranks; a device's
idle share in a stage is the part of the stage's time the device is not busy. ``whole run`` is the time from the
first group call after the constructors (``__init__``, which are in the trace but no stage, nor are the spans inside
them: a constructor's collective) to the last span.
Imports the layers below.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from hwplace.foundation.trace import CALL, IDLE, WAIT
from hwplace.foundation.wording import plural

Intervals = list[tuple[float, float]]
WHOLE_RUN = "whole run"
CONSTRUCTOR = "__init__"
SHORT_STAGE = 0.01  # the report leaves out stages shorter than this share of the whole run


def union(intervals: Iterable[tuple[float, float]]) -> Intervals:
    """The intervals merged: sorted, disjoint."""
    merged: Intervals = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def subtract(kept: Intervals, removed: Intervals) -> Intervals:
    """``kept`` less ``removed``, both merged (:func:`union`)."""
    result: Intervals = []
    j = 0
    for start, end in kept:
        while j < len(removed) and removed[j][1] <= start:
            j += 1
        k, cursor = j, start
        while k < len(removed) and removed[k][0] < end:
            if removed[k][0] > cursor:
                result.append((cursor, removed[k][0]))
            cursor = max(cursor, removed[k][1])
            k += 1
        if cursor < end:
            result.append((cursor, end))
    return result


def overlap(a: Intervals, b: Intervals) -> float:
    """The length of the time both merged lists cover."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if high > low:
            total += high - low
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def length(intervals: Intervals) -> float:
    return sum(end - start for start, end in intervals)


RUNTIME_WAITS = ("turn.wait", "weights.latest")  # hwplace's own waits on another component, with channel ones
CHANNEL_NOTES = ("channel", "on")  # the notes hwplace gives the spans of its channel operations
BLOCKING = ("get", "get_batch", "put")  # the channel operations that wait for an item or for room


def recorded_by_hwplace(event: Mapping[str, Any]) -> bool:
    """Whether a ``wait`` span is one hwplace records (a channel operation: its notes name the channel; a turn; a
    weight version), not one a job marks with ``hwplace.span`` (a collective: a wait on the component's own
    ranks)."""
    args = event.get("args") or {}
    return event["name"] in RUNTIME_WAITS or any(note in args for note in CHANNEL_NOTES)


def on_another(event: Mapping[str, Any]) -> bool:
    """Whether a ``wait`` span waits on another component: a channel operation that waits for an item or for room,
    a turn on a shared accelerator, a weight version. The other channel operations (``ack``, ``put_nowait``,
    ``qsize``, ...) wait only for the channel's host to answer: the caller's own time, as a collective's is."""
    args = event.get("args") or {}
    if any(note in args for note in CHANNEL_NOTES):
        return event["name"] in BLOCKING
    return event["name"] in RUNTIME_WAITS


def constructors(events: Iterable[Mapping[str, Any]]) -> dict[str, Intervals]:
    """Per track (``pid:tid``), the spans of its constructors (``__init__``)."""
    found: dict[str, Intervals] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and event["name"] == CONSTRUCTOR and event.get("cat") == CALL:
            found[f"{event.get('pid')}:{event.get('tid')}"].append((event["ts"], event["ts"] + event["dur"]))
    return found


def launching(event: Mapping[str, Any], launches: Mapping[str, Intervals]) -> bool:
    """Whether ``event`` is a constructor or lies inside one on its track (a collective the constructor waits in,
    say): part of launching the worker, not of the run."""
    if event["name"] == CONSTRUCTOR:
        return True
    start, end = event["ts"], event["ts"] + event["dur"]
    return any(low <= start and end <= high for low, high in launches.get(f"{event.get('pid')}:{event.get('tid')}", ()))


@dataclass(frozen=True)
class Hold:
    """What held the run up once: a wait longer than the usual (median) wait of its kind (its worker's group, name,
    channel and queue), by ``excess`` µs; for a collective (a wait on the component's own ranks) one entry per
    collective, its ranks' excesses summed and charged to ``culprit``, the rank that came to it last (the one the
    others waited for), less what the culprit's own waits on other components explain (listed themselves).
    ``waiters`` are track keys, ``culprit`` one or ``None`` (a wait on another component)."""

    excess: float
    start: float
    name: str
    waiters: tuple[str, ...]
    longest: float
    usual: float
    culprit: str | None
    args: Mapping[str, Any]


class TraceSummary:
    """The numbers ``hwplace report`` prints, worked out once from a merged trace (times in microseconds)."""

    def __init__(self, trace: Mapping[str, Any], node_type: str | None = None) -> None:
        tracks: Mapping[str, Mapping[str, Any]] = trace["otherData"]["hwplace"]["tracks"]
        self.tracks = tracks
        spans: dict[str, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))  # track -> category -> ...
        stage_spans: dict[str, Intervals] = defaultdict(list)
        self.waits: list[tuple[float, float, str, str, Mapping[str, Any]]] = []  # dur, start, track, name, args
        self.called: dict[str, list[tuple[float, float, str]]] = defaultdict(list)  # track -> its group calls
        first, last = float("inf"), float("-inf")
        launches = constructors(trace["traceEvents"])
        for event in trace["traceEvents"]:
            key = f"{event.get('pid')}:{event.get('tid')}"
            if event.get("ph") != "X" or key not in tracks:
                continue
            start, end = event["ts"], event["ts"] + event["dur"]
            if launching(event, launches):  # a constructor and what it waited in: not part of the run's steps
                continue
            spans[key][event.get("cat", "")].append((start, end))
            if event.get("cat") == IDLE:  # between calls: no part of the run's window
                continue
            first, last = min(first, start), max(last, end)
            if event.get("cat") == CALL:
                stage_spans[f"{tracks[key]['group']}.{event['name']}"].append((start, end))
                self.called[key].append((start, end, event["name"]))
            elif event.get("cat") == WAIT:
                self.waits.append((event["dur"], start, key, event["name"], event.get("args") or {}))
        self.window: Intervals = [(first, last)] if last > first else []
        self.calls = {key: union(by_category[CALL]) for key, by_category in spans.items()}
        self.busy = {key: subtract(self.calls[key], union(by_category[WAIT])) for key, by_category in spans.items()}
        self.spans = spans
        self.stages = {WHOLE_RUN: self.window, **{name: union(found) for name, found in sorted(stage_spans.items())}}
        self.waits.sort(key=lambda wait: (-wait[0], wait[1]))
        holders: dict[tuple[int, str], list[str]] = defaultdict(list)
        for key, track in tracks.items():
            for device in track.get("devices", []):
                if node_type is not None and device.startswith(f"{node_type} "):
                    continue  # a node-kind resource: the node's processes share it, it is no device
                holders[track["node"], device].append(key)
        self.devices = dict(sorted(holders.items()))

    def wait_totals(self) -> list[tuple[str, str, float, int, float]]:
        """Per worker and kind of wait (its name, and its channel when it has one): (worker, kind, total µs, count,
        longest µs), the largest total first."""
        totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0.0])
        for duration, _, key, name, args in self.waits:
            kind = f"{name} {args['channel']!r}" if isinstance(args.get("channel"), str) else name
            entry = totals[self.worker(key), kind]
            entry[0] += duration
            entry[1] += 1
            entry[2] = max(entry[2], duration)
        rows = [(worker, kind, total, int(count), longest)
                for (worker, kind), (total, count, longest) in totals.items()]
        return sorted(rows, key=lambda row: (-row[2], row[0], row[1]))

    def _kind(self, key: str, name: str, args: Mapping[str, Any]) -> tuple[Any, ...]:
        return (self.tracks[key]["group"], name, *(str(args.get(note)) for note in ("channel", "queue", "on")))

    def stepped(self) -> list[int]:
        """The waits (indices into :attr:`waits`) in the calls the driver makes every step (the methods called
        most often on one rank) but a rank's first (it waits for the pipeline to fill): what the steps waited for.
        Every wait when no method was called more than once."""
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for key, calls in self.called.items():
            for _, _, name in calls:
                counts[key, name] += 1
        steps = max(counts.values(), default=0)
        if steps < 2:
            return _outermost(self.waits, range(len(self.waits)))
        inside: dict[str, Intervals] = defaultdict(list)  # per worker (its rank's tracks alike): its steps' calls
        for key, calls in self.called.items():
            ordered = sorted((start, end) for start, end, name in calls if counts[key, name] >= steps)
            inside[self.worker(key).split(" (")[0]] += ordered[1:]
        merged = {worker: union(found) for worker, found in inside.items()}
        chosen = [index for index, (duration, start, key, _, _) in enumerate(self.waits)
                  if any(low <= start and start + duration <= high for low, high in merged.get(self.worker(key).split(
                      " (")[0], ()))]
        return _outermost(self.waits, chosen)

    def holds(self) -> list[Hold]:
        """The waits of the steps (:meth:`stepped`) beyond the usual of their kind, a collective's charged to its
        last rank: the largest first."""
        chosen = self.stepped()
        kinds: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        for index in chosen:
            duration, _, key, name, args = self.waits[index]
            kinds[self._kind(key, name, args)].append(duration)
        usual = {kind: statistics.median(found) for kind, found in kinds.items()}
        peers: dict[tuple[str, str], list[int]] = defaultdict(list)  # a collective's waits by group and name
        for index in chosen:
            _, _, key, name, args = self.waits[index]
            if not recorded_by_hwplace({"name": name, "args": args}):
                peers[self.tracks[key]["group"], name].append(index)
        found: dict[tuple[str, int], list[Any]] = {}
        excesses = {i: max(0.0, self.waits[i][0] - usual[self._kind(*self.waits[i][2:])]) for i in chosen}
        for index in chosen:
            duration, start, key, name, args = self.waits[index]
            kind = self._kind(key, name, args)
            excess, last = excesses[index], index
            if not recorded_by_hwplace({"name": name, "args": args}):
                last = self._last(index, peers[self.tracks[key]["group"], name])
            entry = found.setdefault(("c", last) if last != index else ("w", index),
                                     [0.0, start, name, [], 0.0, usual[kind], None, args])
            if last != index:  # the late rank's own waits on others, beyond the waiter's, explain its lateness
                excess = max(0.0, excess - max(0.0, self._explained(last, excesses) - self._explained(index, excesses)))
            entry[0] += excess
            entry[3].append(key)
            entry[4] = max(entry[4], duration)
            if last != index:
                entry[1], entry[6] = min(entry[1], start), self.waits[last][2]
        holds = [Hold(e[0], e[1], e[2], tuple(e[3]), e[4], e[5], e[6], e[7]) for e in found.values()]
        return sorted(holds, key=lambda hold: (-hold.excess, hold.start))

    def _explained(self, last: int, excesses: Mapping[int, float]) -> float:
        """The excess of the waits on other components (hwplace's) of a rank in its group call before it came to
        collective wait ``last``: the lateness they explain is theirs (listed themselves), not the rank's own."""
        _, arrived, key, _, _ = self.waits[last]
        call = next(((low, high) for low, high, _ in self.called[key] if low <= arrived <= high), (arrived, arrived))
        return sum(excess for index, excess in excesses.items() if self.waits[index][2] == key
                   and call[0] <= self.waits[index][1] and self.waits[index][1] + self.waits[index][0] <= arrived
                   and recorded_by_hwplace({"name": self.waits[index][3], "args": self.waits[index][4]}))

    def _last(self, index: int, collective: list[int]) -> int:
        """Of the waits of other ranks in the same collective as wait ``index`` (one a rank: the one overlapping it
        most), the one that started last, or ``index`` when it started last itself."""
        duration, start, key, _, _ = self.waits[index]
        rank = self.tracks[key]["rank"]
        best: dict[int, tuple[float, int]] = {}
        for other in collective:
            length_, begun, where, _, _ = self.waits[other]
            shared = min(start + duration, begun + length_) - max(start, begun)
            peer = self.tracks[where]["rank"]
            if peer != rank and shared > 0 and shared > best.get(peer, (0.0, -1))[0]:
                best[peer] = (shared, other)
        return max([index, *(other for _, other in best.values())], key=lambda i: (self.waits[i][1], i == index))

    def worker(self, key: str) -> str:
        track = self.tracks[key]
        thread = "" if track.get("main", True) else f" ({track.get('thread')})"
        return f"{track['group']} rank {track['rank']}{thread}"

    def device_busy(self, device: tuple[int, str]) -> Intervals:
        return union(interval for key in self.devices[device] for interval in self.busy.get(key, []))

    def idle_shares(self, device: tuple[int, str]) -> dict[str, tuple[float, float]]:
        """Per stage: its time (µs) and the share of it the device is idle."""
        busy = self.device_busy(device)
        shares = {}
        for stage, window in self.stages.items():
            span = length(window)
            if span > 0:
                shares[stage] = (span, 1 - overlap(busy, window) / span)
        return shares

    def workers(self) -> dict[str, dict[str, float]]:
        """Per worker, over its time from its first group call's start to its last one's end (constructors left
        out): the shares of that time ``in calls``, ``waiting`` in them, ``between calls``, and ``covered`` by any
        span."""
        by_worker: dict[str, dict[str, Intervals]] = defaultdict(lambda: defaultdict(list))
        for key, track in self.tracks.items():
            for category, found in self.spans.get(key, {}).items():
                by_worker[f"{track['group']} rank {track['rank']}"][category] += found
        result = {}
        for worker, categories in sorted(by_worker.items()):
            calls = union(categories[CALL])
            if not calls:
                continue
            window = [(calls[0][0], calls[-1][1])]
            span = length(window)
            if span <= 0:
                continue
            every = union(interval for found in categories.values() for interval in found)
            result[worker] = {"in calls": length(calls) / span,
                              "waiting": overlap(union(categories[WAIT]), calls) / span,
                              "between calls": overlap(union(categories[IDLE]), window) / span,
                              "covered": overlap(every, window) / span}
        return result

    def coverage(self) -> dict[str, float]:
        """Per worker: the share of its time from its first group call's start to its last one's end that its
        spans cover (constructors left out)."""
        return {worker: shares["covered"] for worker, shares in self.workers().items()}


def _outermost(waits: list[tuple[float, float, str, str, Mapping[str, Any]]], chosen: Iterable[int]) -> list[int]:
    """``chosen`` less the waits inside another wait of their track (a channel's get in a job's collective span):
    the outer one says what the time was spent waiting for."""
    kept: list[int] = []
    reach: dict[str, float] = {}
    for index in sorted(chosen, key=lambda i: (waits[i][1], -waits[i][0])):  # by start, the longer first
        duration, start, key, _, _ = waits[index]
        if start + duration <= reach.get(key, float("-inf")):
            continue
        kept.append(index)
        reach[key] = max(reach.get(key, float("-inf")), start + duration)
    return kept


def print_report(trace: Mapping[str, Any], out: TextIO, top: int = 10, node_type: str | None = None) -> TraceSummary:
    """Print each device's idle share per stage, the ``top`` top waits and longest waits; returns the numbers.
    Resources of ``node_type`` (the node-kind backend's) are no devices."""
    summary = TraceSummary(trace, node_type)
    workers = {(t["group"], t["rank"]) for t in summary.tracks.values()}
    nodes = {t["node"] for t in summary.tracks.values()}
    whole = length(summary.window) / 1e6
    out.write(f"trace: {plural(len(workers), 'worker')} on {plural(len(nodes), 'node')}; the whole run, from the first "
              f"group call after the constructors to the last span, is {whole:.3f} s\n")
    if summary.devices:
        out.write("\nidle share of each device per stage (time no worker holding it computes: outside group calls "
                  "or waiting in one)\n")
        width = max(len(stage) for stage in summary.stages)
        for device in summary.devices:
            holders = ", ".join(sorted({summary.worker(k).split(" (")[0] for k in summary.devices[device]}))
            out.write(f"  node {device[0]} {device[1]}  ({holders})\n")
            for stage, (span, idle) in summary.idle_shares(device).items():
                if span < SHORT_STAGE * length(summary.window):  # a one-off call (attach, report): noise here
                    continue
                out.write(f"    {stage:<{width}}  {span / 1e6:9.3f} s  idle {100 * idle:5.1f}%\n")
    else:
        out.write("\nno worker holds an accelerator or device: no idle shares\n")
    out.write("\neach worker's time, from its first group call to the end of its last: in calls (waiting in them), "
              "between calls (waiting for its driver), covered by spans\n")
    for worker, shares in summary.workers().items():
        out.write(f"  {worker:<24} in calls {100 * shares['in calls']:5.1f}% (waiting {100 * shares['waiting']:5.1f}%)"
                  f"  between calls {100 * shares['between calls']:5.1f}%  covered {100 * shares['covered']:5.1f}%\n")
    if summary.waits:
        out.write(f"\nwaits by worker and kind, the largest totals (top {top})\n")
        for worker, kind, total, count, longest in summary.wait_totals()[:top]:
            out.write(f"  {worker:<24} {kind:<36} {total / 1e6:8.3f} s in {count:>6}, "
                      f"longest {longest / 1e3:8.1f} ms\n")
    if summary.waits:
        out.write(f"\ntop waits of the steps (in the calls made every step, the first left out): each wait's time "
                  f"beyond the usual (median) of its kind, a collective's summed over its ranks and charged to the "
                  f"rank they waited for (top {top})\n")
    for hold in summary.holds()[:top]:
        at = (hold.start - summary.window[0][0]) / 1e6 if summary.window else 0.0
        waiters = ", ".join(sorted({summary.worker(k) for k in hold.waiters}))
        detail = ", ".join(f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}" for k, v in hold.args.items())
        what = f"{summary.worker(hold.culprit)} held up {waiters} in" if hold.culprit else f"{waiters} in"
        out.write(f"  {hold.excess / 1e3:10.1f} ms  {what} {hold.name} at {at:.3f} s (waited "
                  f"{hold.longest / 1e3:.1f} ms, usually {hold.usual / 1e3:.1f} ms){'  ' + detail if detail else ''}\n")
    out.write(f"\nlongest waits (top {top})\n" if summary.waits else "\nno waits recorded\n")
    for duration, start, key, name, args in summary.waits[:top]:
        detail = ", ".join(f"{k} {v!r}" if isinstance(v, str) else f"{k} {v}" for k, v in args.items())
        at = (start - summary.window[0][0]) / 1e6 if summary.window else 0.0
        out.write(f"  {duration / 1e3:10.1f} ms  {summary.worker(key):<24} {name:<16} at {at:8.3f} s"
                  f"{'  ' + detail if detail else ''}\n")
    return summary
