"""The `kdispatch` command. `kdispatch list` shows every definition, its baseline and variants here;
the tuning commands (`tune`, `route`, `bench`, `explain`, `report`, `add`, `export-traces`) live in
kdispatch.tuner and load only when asked for."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys


def cmd_list(args) -> int:
    from kdispatch import arch, definitions, registry

    here = args.arch or arch.local_arch()
    print(f"architecture here: {here}")
    for name in definitions.names():
        if args.definition and definitions.resolve_name(args.definition) != name:
            continue
        base = registry.baseline(name, here)
        print(f"\n{definitions.FULL_TO_SHORT[name]}  ({name})")
        print(f"  baseline on {here}: {base.name}")
        for v in registry.variants(name):
            why = v.why_not(here)
            state = "runs here" if why is None else f"not here: {why}"
            role = " [baseline]" if v is base else (" [baseline elsewhere]" if v.baseline else "")
            print(f"  - {v.name:<28} {v.backend:<8} {'/'.join(v.archs):<12} {v.provenance}  {state}{role}")
    failures = registry.import_failures()
    if failures:
        print("\nkernel modules that did not load:")
        for mod, why in sorted(failures.items()):
            print(f"  - {mod}: {why}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kdispatch", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="definitions, baselines and variants, and whether each runs here")
    p.add_argument("definition", nargs="?", help="only this definition (full or short name)")
    p.add_argument("--arch", help="judge for this architecture instead of this machine's (e.g. sm90)")
    p.set_defaults(func=cmd_list)
    if importlib.util.find_spec("kdispatch.tuner.cli") is not None:
        importlib.import_module("kdispatch.tuner.cli").add_commands(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
