"""The `kdispatch` command. `kdispatch list` shows every definition, its baseline and variants here;
the tuning commands (`tune`, `route`, `bench`, `explain`, `report`, `add`) live in
kdispatch.tuner and load only when asked for."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path


def _shown_path(path: Path) -> str:
    """A variant's file relative to the project (or installed package) root."""
    for root in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parent):
        try:
            return str(path.relative_to(root))
        except ValueError:
            continue
    return str(path)


def cmd_list(args) -> int:
    from kdispatch import arch, definitions, registry
    from kdispatch.dispatch import HOST_ARCHS

    here = args.arch or arch.local_arch()
    print(f"architecture here: {here}")
    try:
        wanted = definitions.resolve_name(args.definition) if args.definition else None
    except ValueError as exc:
        print(f"kdispatch list: {exc}", file=sys.stderr)
        return 2
    for name in definitions.names():
        if wanted and wanted != name:
            continue
        d = definitions.get(name)
        base = registry.baseline(name, here)
        print(f"\n{d.short}  ({name})")
        print(f"  baseline on {here}: {base.name}")
        has_router = importlib.util.find_spec(f"kdispatch.routers.{here}.{name}") is not None \
            if importlib.util.find_spec(f"kdispatch.routers.{here}") is not None else False
        if here not in HOST_ARCHS:
            if not has_router:
                print(f"  no router for {here}: every call gets the baseline")
            gaps = registry.baseline_gaps(name, here)
            if gaps:
                print(f"  WARNING: the baseline here is the torch reference (far slower than a kernel): {'; '.join(gaps)}")
        for v in registry.variants(name):
            why = v.why_not(here)
            state = "runs here" if why is None else f"not here: {why}"
            role = " [baseline]" if v is base else (" [baseline elsewhere]" if v.baseline else "")
            print(f"  - {v.name:<28} {v.backend:<8} {'/'.join(v.archs):<12} {v.provenance}  "
                  f"{_shown_path(v.source):<44} {state}{role}")
    failures = registry.import_failures()
    if failures:
        print("\nkernel modules that did not load:")
        for mod, why in sorted(failures.items()):
            print(f"  - {mod}: {why}")
    return 0


def main(argv=None) -> int:
    from kdispatch import __version__

    parser = argparse.ArgumentParser(prog="kdispatch", description=__doc__)
    parser.add_argument("--version", action="version", version=f"kdispatch {__version__}")
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
