"""`python -m kdispatch.definitions sync`: copy each reference module's text into its definition JSON."""
import json
import sys

from kdispatch import definitions


def sync() -> int:
    changed = 0
    for name in definitions.names():
        p = definitions.path(name)
        d = json.loads(p.read_text())
        text = definitions.reference_path(name).read_text()
        if d.get("reference") != text:
            d["reference"] = text
            p.write_text(json.dumps(d, indent=2) + "\n")
            changed += 1
            print(f"updated {p}")
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["sync"]:
        sys.exit("usage: python -m kdispatch.definitions sync")
    sync()
