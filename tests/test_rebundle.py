"""benchmarks/rebundle.sh on a scratch repository: the bundles fit the transfer budget beside the
tree, and their take.sh scripts, run in any order, rebuild every staged file byte for byte (a dry
run: KD_DRY skips the installer); shared/device's folders (c1 ..) become b1 .. with their parts in
/tmp/kd-parts, another staged folder its own bundles with parts of their own."""
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("args, prefix, parts_there", [((), "b", "/tmp/kd-parts"), (("qla", "q"), "q", "/tmp/kd-parts-q")])
def test_bundles_fit_and_rebuild_every_file(tmp_path, args, prefix, parts_there):
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    for name in ("rebundle.sh", "rebundle_take.sh"):
        shutil.copy(ROOT / "benchmarks" / name, repo / "benchmarks" / name)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("/.kd-wheels/\n")
    rng = random.Random(0)
    staged = {"c1/a.whl": 3 * MiB + 5, "c1/b.whl": 100, "c2/part.aa": 9 * MiB + 7, "c3/part.ab": 5 * MiB, "c3/BIGWHEEL": 20}
    if args:  # another staged folder beside shared/device's: only its files are bundled
        (repo / ".kd-wheels" / "qla").mkdir(parents=True)
        (repo / ".kd-wheels" / "qla" / "gpu-setup.sh").write_text("exit 3\n")
        staged, others = {"qla/t.whl": 7 * MiB + 1, "qla/f.whl": 300}, staged
    else:
        others = {}
    for rel, size in {**staged, **others}.items():
        p = repo / ".kd-wheels" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))
    for c in ("c1", "c2", "c3"):
        (repo / ".kd-wheels" / c / "gpu-setup.sh").write_text("exit 3\n")  # never run in a dry run
    env = {**os.environ, "KD_TRANSFER_MIB": "4"}
    out = subprocess.run(["bash", "benchmarks/rebundle.sh", *args], cwd=repo, env=env, check=True, capture_output=True,
                         text=True)
    bundles = sorted((repo / ".kd-wheels").glob(f"{prefix}[0-9]*"))
    assert len(bundles) >= (5 if not args else 2), out.stdout
    tree = sum(f.stat().st_size for f in (repo / "benchmarks").iterdir())
    for b in bundles:
        assert sum(f.stat().st_size for f in b.iterdir()
                   if f.name not in ("take.sh", "gpu-setup.sh", "MANIFEST", "PARTS")) <= 4 * MiB - tree
        assert (b / "PARTS").read_text().strip() == parts_there
    parts = tmp_path / "parts"
    for b in reversed(bundles):
        subprocess.run(["bash", str(b / "take.sh")], env={**env, "KD_PARTS": str(parts), "KD_DRY": "1"}, check=True)
    for rel in staged:
        assert (parts / Path(rel).name).read_bytes() == (repo / ".kd-wheels" / rel).read_bytes(), rel
    assert not list(parts.glob("*.p0*")), "pieces removed once joined"
