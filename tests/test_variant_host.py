"""benchmarks/variant_host.py fills in the axes a --shape leaves out: from the definition's first contest
workload, or its first coverage one where it has none (the engine conventions)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import variant_host  # noqa: E402
from kdispatch import workloads  # noqa: E402

POOL = "gdn_prefill_pool_qk16_v32_d128_k_last"


def test_an_engine_convention_takes_its_other_axes_from_its_first_coverage_workload():
    assert not workloads.load_workloads("traces", POOL)  # no contest workloads: the case this covers
    first = dict(workloads.load_workloads("traces/coverage", POOL)[0].axes)
    axes = variant_host.axes_of(POOL, {"total_seq_len": 64, "num_seqs": 1})
    assert axes == {**first, "total_seq_len": 64, "num_seqs": 1}


def test_a_contest_definition_takes_its_first_contest_workload_and_an_unknown_axis_is_an_error():
    first = dict(workloads.load_workloads("traces", "gdn_decode_qk4_v8_d128_k_last")[0].axes)
    assert variant_host.axes_of("gdn_decode_qk4_v8_d128_k_last", {}) == first
    with pytest.raises(SystemExit, match="no axes"):
        variant_host.axes_of(POOL, {"len_cu_seqlens": 2})
