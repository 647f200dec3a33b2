#!/usr/bin/env bash
# Re-packs the GPU machine's package bundles (shared/device's stage-wheels.sh: .kd-wheels/c1 ..)
# into bundles that each fit one transfer beside the working tree. A transfer carries the tracked
# tree and the paths named in `carry`, 64 MiB at most; the tree grows with the results twins (29 MB
# on 2026-11-26, when c2's and c3's 43 MB halves of the CuTe-DSL wheel no longer fit beside it; 18 MB
# on 2026-11-28 once the twins were gzip-compressed: three bundles).
#
#   bash benchmarks/rebundle.sh        # here, after stage-wheels.sh (and benchmarks/stage_engines.sh)
#   bash benchmarks/rebundle.sh qla q  # another staged folder (.kd-wheels/qla, its own gpu-setup.sh)
#                                      # into bundles q1 .. qN, its parts in /tmp/kd-parts-q there
#
# writes .kd-wheels/b1 .. bN (files split where one alone would not fit) and prints the run calls:
# one per bundle, back to back in one hold of the machine, each with carry [".kd-wheels/bK"] and
# the command `bash .kd-wheels/bK/take.sh`. Each copies its files to /tmp/kd-parts there; the call
# that completes the set joins the split files and runs shared/device's gpu-setup.sh (one pip run
# into /tmp/kd-site), so later commands start with `. /tmp/kd-site/env.sh` (or benchmarks/gpu_env.sh).
# The engines bundles (stage_engines.sh) travel as before, first.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
sources=${1:-c[0-9]*}  # folders under .kd-wheels whose files are re-packed (one gpu-setup.sh among them)
prefix=${2:-b}
parts=/tmp/kd-parts
[ "$prefix" = b ] || parts=/tmp/kd-parts-$prefix  # shared/device's gpu-setup.sh reads /tmp/kd-parts
tree=$( (git ls-files; git ls-files --others --exclude-standard) | tr '\n' '\0' | du -cb --files0-from=- | tail -1 | cut -f1)
python3 - "$tree" "$sources" "$prefix" "$parts" <<'PY'
import os, pathlib, shutil, sys

MiB = 1 << 20
# a transfer's 64 MiB, less room for the scripts and for the tree's growth until the bundles travel (with 1 MiB
# spare, bundles made one session were refused the next, 2026-11-29: the results twins had grown)
limit = int(os.environ.get("KD_TRANSFER_MIB", "60")) * MiB
budget = limit - int(sys.argv[1])
if budget < limit // 8:
    sys.exit(f"the working tree leaves {budget / MiB:.1f} MiB a transfer: too little to bundle packages")
root = pathlib.Path(".kd-wheels")
pattern, prefix, parts = sys.argv[2:5]
sources = sorted(p for p in root.glob(pattern) if p.is_dir())
setup = next((p / "gpu-setup.sh" for p in sources if (p / "gpu-setup.sh").exists()), None)
if setup is None:
    sys.exit(f"no .kd-wheels/{pattern}/gpu-setup.sh: stage the packages first (shared/device's stage-wheels.sh, "
             "benchmarks/stage_flashqla.sh)")
files = sorted({f.name: f for c in sources for f in c.iterdir() if f.name != "gpu-setup.sh"}.values())
for old in root.glob(f"{prefix}[0-9]*"):
    shutil.rmtree(old)
# pieces no larger than the budget, largest first into the first bundle with room
pieces = []  # (size, name on the GPU machine, source file, offset)
for f in files:
    size = f.stat().st_size
    n = -(-size // budget) if size > budget else 1
    for k in range(n):
        part = min(budget, size - k * budget)
        pieces.append((part, f"{f.name}.p{k:02d}" if n > 1 else f.name, f, k * budget))
bundles = []
for piece in sorted(pieces, key=lambda p: (-p[0], p[1])):
    home = next((b for b in bundles if sum(p[0] for p in b) + piece[0] <= budget), None)
    if home is None:
        bundles.append(home := [])
    home.append(piece)
joins = {f.name: [p[1] for p in pieces if p[2] == f] for f in files}
manifest = "".join(f"{name} {' '.join(parts)}\n" for name, parts in joins.items())
for i, b in enumerate(bundles, 1):
    out = root / f"{prefix}{i}"
    out.mkdir()
    for size, name, src, offset in b:
        with open(src, "rb") as fi, open(out / name, "wb") as fo:
            fi.seek(offset)
            fo.write(fi.read(size))
    shutil.copy(setup, out / "gpu-setup.sh")
    (out / "MANIFEST").write_text(manifest)
    (out / "PARTS").write_text(parts + "\n")
    shutil.copy(pathlib.Path("benchmarks/rebundle_take.sh"), out / "take.sh")
    print(f"{prefix}{i}: {sum(p[0] for p in b) / MiB:.1f} MiB, {len(b)} files")
print(f"send {prefix}1 .. {prefix}{len(bundles)}, each: carry [\".kd-wheels/{prefix}K\"], "
      f"command: bash .kd-wheels/{prefix}K/take.sh")
PY
