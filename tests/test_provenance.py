"""Provenance is computed: a variant's hash covers its module, the project modules and kernel
sources it uses (transitively), its name, and for a library variant the library's version."""
import importlib.util
import sys
import textwrap

import pytest

from kdispatch import provenance, registry
from kdispatch.registry import Variant


@pytest.fixture
def tree(tmp_path):
    """variant.py imports helper.py (which imports deeper.py) and names kernel.cu (which includes
    common.cuh); unrelated.py sits beside them."""
    files = {
        "variant.py": """
            from pathlib import Path
            import helper
            CU = Path(__file__).with_name("kernel.cu")

            def run(x):
                return helper.twice(x)
        """,
        "helper.py": "from deeper import one\n\ndef twice(x):\n    return x + x * one()\n",
        "deeper.py": "def one():\n    return 1\n",
        "kernel.cu": '#include "common.cuh"\n__global__ void k() {}\n',
        "common.cuh": "#define ONE 1\n",
        "unrelated.py": "X = 1\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def _variant(path, name="toy_variant", backend="torch", requires=()):
    provenance.files_of.cache_clear()
    spec = importlib.util.spec_from_file_location(f"_prov_{path.stem}_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return Variant("gdn_decode", name, mod.run, backend, ("cpu",), requires=requires)


def test_files_are_followed_transitively(tree):
    v = _variant(tree / "variant.py")
    assert {p.name for p in v.files} == {"variant.py", "helper.py", "deeper.py", "kernel.cu", "common.cuh"}


@pytest.mark.parametrize("edited", ["helper.py", "deeper.py", "kernel.cu", "common.cuh", "variant.py"])
def test_editing_a_dependency_changes_the_hash(tree, edited):
    before = _variant(tree / "variant.py").provenance
    (tree / edited).write_text((tree / edited).read_text() + "\n// edited\n" if edited.endswith(("cu", "cuh"))
                               else (tree / edited).read_text() + "\n# edited\n")
    assert _variant(tree / "variant.py").provenance != before


def test_an_unrelated_file_does_not_change_the_hash(tree):
    before = _variant(tree / "variant.py").provenance
    (tree / "unrelated.py").write_text("X = 2\n")
    assert _variant(tree / "variant.py").provenance == before


def test_a_moved_file_keeps_its_hash(tree, tmp_path_factory):
    before = _variant(tree / "variant.py").provenance
    moved = tmp_path_factory.mktemp("moved")
    for p in tree.iterdir():
        (moved / p.name).write_bytes(p.read_bytes())
    assert _variant(moved / "variant.py").provenance == before


def test_two_variants_of_one_file_differ():
    names = ["triton_grouped_m16.fr", "triton_grouped_m32.fr", "triton_grouped_m64.fr"]
    hashes = {registry.get("moe_fp8", n).provenance for n in names}
    assert len(hashes) == 3
    assert len({registry.get("moe_fp8", n).source for n in names}) == 1


def test_a_library_variants_hash_follows_the_library_version(tree, monkeypatch):
    versions = {"somelib": "1.0"}
    monkeypatch.setattr(provenance, "library_versions", lambda mods: {m: versions[m] for m in mods})
    v1 = _variant(tree / "variant.py", backend="library", requires=("somelib",)).provenance
    versions["somelib"] = "1.1"
    v2 = _variant(tree / "variant.py", backend="library", requires=("somelib",)).provenance
    assert v1 != v2
    plain = _variant(tree / "variant.py").provenance  # a non-library variant ignores versions
    versions["somelib"] = "2.0"
    assert _variant(tree / "variant.py").provenance == plain


def test_real_variants_hash_what_they_use():
    files = lambda d, n: {p.name for p in registry.get(d, n).files}  # noqa: E731
    assert "decode_splitv.py" in files("gdn_prefill", "triton_prefill_recurrent")  # its imported helpers
    assert {"indexer_fp8.py", "topk_select.cu"} <= files("dsa_topk_indexer", "cuda_radix_select")
    assert {"indexer_score.cu", "topk_select.cu", "indexer_select.py", "indexer_fp8.py"} <= \
        files("dsa_topk_indexer", "cuda_wgmma_radix")
    assert "moe_fp8.py" in files("moe_fp8", "triton_grouped_m16.fr")  # the reference's routing it reuses
    assert "registry.py" not in files("gdn_decode", "triton_decode_splitv")
    assert registry.get("gdn_decode", "flashinfer").provenance != registry.get("gdn_prefill", "fla_chunk").provenance


def test_missing_dotted_requirements_do_not_raise(capsys):
    v = Variant("gdn_decode", "needs_missing", lambda *a: None, "cuda", ("sm90",), requires=("nopkg_kd.sub",))
    assert v.missing == ("nopkg_kd.sub",) and "missing package" in v.why_not("sm90")
    from kdispatch import cli

    registry.register(v)
    try:
        assert cli.main(["list", "gdn_decode"]) == 0
    finally:
        registry.unregister("gdn_decode", "needs_missing")
    out = capsys.readouterr().out
    assert "needs_missing" in out and "missing package nopkg_kd.sub" in out
    assert "kernels/triton/gdn/decode_splitv.py" in out


def test_a_library_variants_code_change_is_found_under_the_versions_its_rows_recorded():
    """On a machine without the GPU's libraries (here), a library variant's stored hash is compared
    with its current files under the library versions its rows recorded; rows that recorded none
    are not judged."""
    import io
    import types

    from kdispatch.tuner import flows

    v = registry.get("gdn_prefill_gathered_qk4_v8", "vllm_flashinfer_prefill")
    versions = {"flashinfer": "9.9.9", "cuda": "1.7.0"}

    def table(stored_hash, metrics):
        row = types.SimpleNamespace(variant=v.name, variant_hash=stored_hash, metrics=metrics, env="e1")
        gpu = {"id": "e1", "device": "a GPU this machine is not"}
        return types.SimpleNamespace(definition=v.definition, env=gpu, devices=(gpu,),
                                     hashes={v.name: stored_hash}, rows={(v.name, "u1"): row})

    out = io.StringIO()
    assert flows._warn_stale(table(provenance.digest(v.name, v.files, versions), {"library_versions": versions}), out) == []
    assert flows._warn_stale(table("0" * 16, {"library_versions": versions}), out) == [v.name]
    assert "provenance changed since it was measured on a GPU this machine is not" in out.getvalue()
    assert flows._warn_stale(table("0" * 16, {}), io.StringIO()) == []


def test_library_versions_read_the_installed_metadata_once(monkeypatch):
    """A tune asks for them on every measured row of a library variant; the scan of every installed
    distribution costs ~0.25 s."""
    import importlib.metadata

    calls = []
    real = importlib.metadata.packages_distributions
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: calls.append(1) or real())
    provenance._module_distributions.cache_clear()
    provenance._installed_version.cache_clear()
    try:
        first = provenance.library_versions(("torch", "torch.cuda", "no_such_module_here"))
        assert provenance.library_versions(("torch",)) == {"torch": first["torch"]}
        assert first == {"torch": importlib.metadata.version("torch"), "no_such_module_here": "absent"}
        assert len(calls) == 1
    finally:
        provenance._module_distributions.cache_clear()
        provenance._installed_version.cache_clear()


def test_a_variant_whose_library_kernel_is_not_built_is_not_run():
    """`ready=`: asked once, after the package and architecture checks; a probe that raises counts
    as not ready."""
    asked = []

    def probe():
        asked.append(1)
        return "its JIT module is not built"

    v = Variant("gdn_decode", "needs_a_build", lambda *a: None, "library", ("sm90",), ready=probe)
    assert v.why_not("sm100").startswith("runs on sm90") and not asked
    assert v.why_not("sm90") == v.why_not("sm90") == "its JIT module is not built" and len(asked) == 1
    broken = Variant("gdn_decode", "probe_raises", lambda *a: None, "library", ("sm90",),
                     ready=lambda: 1 / 0)
    assert broken.why_not("sm90").startswith("readiness probe raised ZeroDivisionError")
    assert Variant("gdn_decode", "built", lambda *a: None, "library", ("sm90",), ready=lambda: None).why_not("sm90") is None
