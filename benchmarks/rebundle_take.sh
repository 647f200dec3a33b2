#!/usr/bin/env bash
# One bundle of benchmarks/rebundle.sh, run on the GPU machine as .kd-wheels/bK/take.sh: copies the
# bundle's files to /tmp/kd-parts; once every file of MANIFEST is there, whole or in all its pieces,
# joins the pieces and runs the bundle's gpu-setup.sh (shared/device's, or the staged folder's; KD_PARTS
# and KD_DRY=1: a dry run elsewhere). The parts folder is the bundle's PARTS (rebundle.sh), exported to
# the setup as KD_PARTS.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
parts=${KD_PARTS:-$(cat "$here/PARTS" 2>/dev/null || echo /tmp/kd-parts)}
export KD_PARTS=$parts
mkdir -p "$parts"
for f in "$here"/*; do
  case "$(basename "$f")" in take.sh|MANIFEST|PARTS|gpu-setup.sh) ;; *) cp -f "$f" "$parts/" ;; esac
done
while read -r name pieces; do
  [ -f "$parts/$name" ] && continue
  for p in $pieces; do
    [ -f "$parts/$p" ] || { echo "bundle $(basename "$here") staged in $parts; waiting for the others"; exit 0; }
  done
done < "$here/MANIFEST"
while read -r name pieces; do
  if [ ! -f "$parts/$name" ]; then
    (cd "$parts" && cat $pieces > "$name.tmp" && mv "$name.tmp" "$name" && rm -f $pieces)
  fi
done < "$here/MANIFEST"
echo "bundles complete in $parts"
if [ -z "${KD_DRY:-}" ]; then bash "$here/gpu-setup.sh"; fi
