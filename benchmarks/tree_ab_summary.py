"""The arms of benchmarks/tree_ab.sh runs of benchmarks/prefill_cp.py side by side: for each definition, shape
and variant, the median over an arm's runs of the graph median and of its p90, and each arm's graph median
against the "before" arm's in percent.

    python benchmarks/tree_ab_summary.py tree-ab.txt [more-tree-ab.txt ...]

Every file is one tree_ab.sh output ("## before" / "## change" / "## alt" lines, prefill_cp.py tables under
them); several files of the same arms pool their runs.
"""
import argparse
import collections
import re
import statistics

ARMS = ("before", "change", "alt")
CELL = 4  # prefill_cp.py's columns a variant: graph median, graph p90, eager, errors


def runs(paths):
    """{(definition, shape, variant, arm): [(graph median, graph p90), ...]} over every run in the files."""
    cells = collections.defaultdict(list)
    for path in paths:
        arm = definition = None
        variants = []
        for line in open(path):
            words = line.split()
            if line.startswith("## "):
                arm = line[3:].strip()
            elif line.startswith("gdn_"):
                definition = line.strip()
            elif words[:1] == ["shape"]:
                variants = words[1:]
            elif words and re.match(r"\d+x\d+", words[0]) and len(words) == 1 + CELL * len(variants):
                for i, variant in enumerate(variants):
                    graph, p90 = float(words[1 + CELL * i]), float(words[2 + CELL * i])
                    cells[(definition, words[0], variant, arm)].append((graph, p90))
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    cells = runs(ap.parse_args().files)
    arms = [a for a in ARMS if any(key[3] == a for key in cells)]
    if "before" not in arms:
        raise SystemExit("tree_ab_summary: no '## before' runs in the files")
    rows = sorted({key[:3] for key in cells})
    print("graph us: median over the arm's runs of each run's median / p90 of the replays; % against before")
    print(f"{'definition':40} {'shape':>20} {'variant':>7} {'runs':>4}"
          + "".join(f"{a:>16}" for a in arms) + "".join(f"{a + ' %':>9}" for a in arms[1:]))
    for definition, shape, variant in rows:
        medians = {}
        line = f"{definition:40} {shape:>20} {variant.split('.')[-1]:>7}"
        line += f" {len(cells.get((definition, shape, variant, 'before'), [])):>4}"
        for arm in arms:
            got = cells.get((definition, shape, variant, arm))
            if got:
                medians[arm] = statistics.median(g for g, _ in got)
                line += f"{medians[arm]:9.1f}/{statistics.median(p for _, p in got):6.1f}"
            else:
                line += " " * 16
        for arm in arms[1:]:
            line += f"{100 * (medians[arm] / medians['before'] - 1):+9.1f}" if arm in medians and "before" in medians \
                else " " * 9
        print(line)


if __name__ == "__main__":
    main()
