#!/usr/bin/env python3
"""tools/bench_ab.py — compare builds of mmrt by running one benchmark from each, alternately.

On a shared machine one run of a benchmark can be a third slower than the next for reasons
that are not ours (a neighbour on the same physical core, the memory bus), and the slow
stretches last seconds to minutes. Timing build A for a while and then build B measures the
neighbour as much as the change. This runs the command from each build in turn, round after
round (the order rotating, so no build always runs first), and reports each figure's minimum,
median and maximum per build: the form docs/BENCHMARKS.md quotes.

Each build is a directory holding the program and the plugins it loads (a copy of build/bin);
the command runs as DIR/PROGRAM with MMRT_PLUGIN_PATH=DIR, plus any VAR=VALUE given after the
directory. Figures are read from the output:

  - table rows of cpu-gemm-bench and cpu-attn-bench: "<rows> <ms> ..." gives "ms @ <rows>";
  - mmrt-bench --json: decode ms per token, its fraction of the read limit, prefill and vision
    ms, tokens/s while every sequence decodes, and any --key a.b.c given;
  - lines naming a digest ("output digest ..."): whether the builds computed the same bits.

    cp -r build/bin /tmp/base   # before the change; rebuild, then:
    python3 tools/bench_ab.py --rounds 5 base=/tmp/base new=build/bin -- \\
        cpu-gemm-bench --dtype f16 --k 4096 --n 11008 --copies 6 --repeat 10 1 16
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

JSON_FIGURES = [
    ("decode ms/token", "stages.decode_ms_per_token.value"),
    ("decode fraction of read limit", "stages.decode_ms_per_token.ratio"),
    ("prefill ms", "stages.prefill_ms.value"),
    ("vision ms", "stages.vision_ms.value"),
    ("tokens/s while all decode", "throughput.decode_window_tokens_per_s"),
]
ROW = re.compile(r"^\s*(\d+)\s+(\d+(?:\.\d+)?)\s")


def parse_build(text):
    """NAME=DIR[,VAR=VALUE...] -> (name, dir, env)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise argparse.ArgumentTypeError(f"build '{text}': expected NAME=DIR[,VAR=VALUE...]")
    parts = rest.split(",")
    env = {}
    for kv in parts[1:]:
        var, sep, value = kv.partition("=")
        if not sep or not var:
            raise argparse.ArgumentTypeError(f"build '{text}': '{kv}' is not VAR=VALUE")
        env[var] = value
    if not os.path.isdir(parts[0]):
        raise argparse.ArgumentTypeError(f"build '{name}': {parts[0]} is not a directory")
    return name, os.path.abspath(parts[0]), env


def lookup(doc, path):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc if isinstance(doc, (int, float)) and not isinstance(doc, bool) else None


def figures(out, keys):
    """The figures and digests one run printed."""
    found, digests = {}, []
    stripped = out.strip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ValueError(f"output looks like JSON but does not parse: {e}") from None
        for label, path in JSON_FIGURES + [(k, k) for k in keys]:
            v = lookup(doc, path)
            if v is not None:
                found[label] = float(v)
        return found, digests
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            found[f"ms @ {m.group(1)}"] = float(m.group(2))
        if "digest" in line:
            digests.append(line.strip())
    return found, digests


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="runs of each build (default 5)")
    ap.add_argument("--key", action="append", default=[],
                    help="another mmrt-bench JSON figure, as a dotted path")
    ap.add_argument("builds", nargs="+", type=parse_build, metavar="NAME=DIR[,VAR=VALUE...]")
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the command after --")
    cut = argv.index("--")
    args = ap.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        ap.error("no command after --")
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    results = {}  # label -> build -> [values]
    digests = {}  # build -> set of digest lines
    builds = args.builds
    for r in range(args.rounds):
        for i in range(len(builds)):
            name, directory, extra = builds[(i + r) % len(builds)]
            env = dict(os.environ, MMRT_PLUGIN_PATH=directory, **extra)
            program = os.path.join(directory, command[0])
            try:
                run = subprocess.run([program] + command[1:], env=env, capture_output=True,
                                     text=True)
            except OSError as e:
                sys.exit(f"bench_ab: build '{name}': cannot run {program}: {e}")
            if run.returncode != 0:
                tail = "\n".join(run.stderr.strip().splitlines()[-5:])
                sys.exit(f"bench_ab: build '{name}', round {r + 1}: {program} exited "
                         f"{run.returncode}\n{tail}")
            try:
                found, dig = figures(run.stdout, args.key)
            except ValueError as e:
                sys.exit(f"bench_ab: build '{name}', round {r + 1}: {e}")
            if not found:
                sys.exit(f"bench_ab: build '{name}', round {r + 1}: no figures in the output of "
                         f"{program}")
            for label, v in found.items():
                results.setdefault(label, {}).setdefault(name, []).append(v)
            digests.setdefault(name, set()).update(dig)
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)

    width = max(len(b[0]) for b in builds)
    for label, per in results.items():
        print(label)
        for name, _, _ in builds:
            v = per.get(name, [])
            if v:
                print(f"  {name:<{width}}  min {min(v):10.4g}  median {statistics.median(v):10.4g}"
                      f"  max {max(v):10.4g}  n {len(v)}")
    if any(digests.values()):
        sets = {name: frozenset(d) for name, d in digests.items()}
        same = len(set(sets.values())) == 1
        print("digests:", "the same in every build" if same else "DIFFER between builds")
        if not same:
            for name, d in sets.items():
                for line in sorted(d):
                    print(f"  {name}: {line}")


if __name__ == "__main__":
    main()
