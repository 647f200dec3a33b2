"""The README's performance table is generated from the committed bench results (no typed numbers)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_performance_table_is_current():
    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0, "run: python benchmarks/readme_table.py"


def test_peers_table_renders_each_peer_and_the_baseline(tmp_path):
    """One row per peer of a definition plus the baseline's (from the bench's own comparison); no file:
    a line saying how to make it."""
    import json

    spec = importlib.util.spec_from_file_location("readme_table", ROOT / "benchmarks" / "readme_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = ROOT / "benchmarks" / "results" / "bench-peers-test-H100.json"  # relative_to(ROOT) must hold
    assert "No peer run yet" in mod.peers_tables([path])
    mode = {"routed_geomean_speedup": 1.5, "slower_than_baseline": 0}
    peer = {"workloads": 3, "routed_geomean_speedup": 0.9, "routed_min_speedup": 0.8, "slower_than_peer": 2}
    res = {"env": {"device": "GPU X"}, "complete": True,
           "results": [{"measured_at": "2026-11-28T00:00:00Z"}],
           "summary": {"moe_fp8_block_scale_ds_routing_topk8_ng8_kg4_e32_h7168_i2048": {
               "workloads": 4, "baseline": "sglang_triton_moe", "graph": mode, "eager": mode,
               "peers": {"deepgemm_fused": {"graph": dict(peer, workloads=0, routed_geomean_speedup=None,
                                                          routed_min_speedup=None, slower_than_peer=0),
                                            "eager": peer}}}}}
    try:
        path.write_text(json.dumps(res))
        text = mod.peers_tables([path])
    finally:
        path.unlink()
    assert "| `moe_fp8` | `sglang_triton_moe` (baseline) | 1.50x | 4 | 0 | 1.50x | 4 | 0 |" in text
    assert "| `moe_fp8` | `deepgemm_fused` | n/a | 0 | 0 | 0.90x (0.80x) | 3 | 2 |" in text
