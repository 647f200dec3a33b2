from setuptools import setup

# Top-level folders map into the one `kdispatch` namespace (see DESIGN.md), so nothing generic
# like `kernels` lands in site-packages.
PACKAGE_DIR = {
    "kdispatch": "kdispatch",
    "kdispatch.kernels": "kernels",
    "kdispatch.routers": "routers",
    "kdispatch.tuner": "tuner",
}


def _packages():
    import os

    found = []
    for pkg, root in PACKAGE_DIR.items():
        for dirpath, _dirs, files in os.walk(root):
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, root)
                found.append(pkg if rel == "." else pkg + "." + rel.replace(os.sep, "."))
    return sorted(found)


setup(
    name="kdispatch",
    version="0.1.0",
    description="Shape-aware dispatch of LLM-serving GPU kernels with an autotuning router compiler",
    python_requires=">=3.10",
    packages=_packages(),
    package_dir=PACKAGE_DIR,
    package_data={"kdispatch": ["definitions/*/*.json"], "kdispatch.kernels": ["cuda/*/*.cu", "cuda/*/*.cuh"]},
    install_requires=["torch>=2.6", "numpy"],
    extras_require={
        "triton": ["triton"],
        "cuda": ["cuda-python", "nvidia-cuda-nvrtc"],
        "tune": ["flashinfer-bench", "matplotlib"],
        "test": ["pytest", "pytest-xdist", "triton", "cuda-python", "nvidia-cuda-nvrtc", "flashinfer-bench", "safetensors"],
    },
    entry_points={
        "console_scripts": ["kdispatch = kdispatch.cli:main"],
        # SGLang loads these in every process; kdispatch's hooks register only with KDISPATCH_SGLANG=1
        "sglang.srt.plugins": ["kdispatch = kdispatch.integrations.sglang:register"],
        # vLLM loads these in every worker; kdispatch's patch applies only with KDISPATCH_VLLM=1
        "vllm.general_plugins": ["kdispatch = kdispatch.integrations.vllm:register"],
    },
)
