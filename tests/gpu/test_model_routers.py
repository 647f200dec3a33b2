"""The router of this GPU's model serves it: `arch_of` names the model, and where
routers/<arch>/<model>/ holds a router for a definition, the dispatcher's answers are its own."""
import importlib
from pathlib import Path

import pytest
import torch

import kdispatch
from kdispatch.arch import arch_of, device_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

ROUTERS = Path(kdispatch.__file__).resolve().parents[1] / "routers"


def test_the_architecture_names_the_gpu_model():
    arch = arch_of(torch.device("cuda", 0))
    assert arch.model == device_module(torch.cuda.get_device_name(0))
    assert arch == f"sm{''.join(map(str, torch.cuda.get_device_capability(0)))}"


def test_a_model_with_routers_of_its_own_is_served_by_them():
    arch = arch_of(torch.device("cuda", 0))
    own = sorted((ROUTERS / arch / arch.model).glob("*.py")) if arch.model else []
    own = [p for p in own if p.name != "__init__.py"]
    if not own:
        pytest.skip(f"no routers of {arch.model} under routers/{arch}/")
    for path in own:
        d = next((x for x in kdispatch.ops.DISPATCHERS.values() if x.definition == path.stem), None)
        if d is None:
            continue
        mod = importlib.import_module(f"kdispatch.routers.{arch}.{arch.model}.{path.stem}")
        assert d.router(arch)["graph"] is mod.route, path
        assert d.router(str(arch))["graph"] is not mod.route, "a plain architecture name gets the joint router"
