"""megatron-endprompt: train long context windows on short sequences (EndPrompt) in Megatron-Core.

Ranges here are compatible ranges, so the package installs into an NGC-style GPU environment
without replacing its torch; the exact tested set lives in requirements-dev.txt. Transformer
Engine and NVIDIA apex are optional GPU extras (see README): never list ``apex`` here — the
PyPI package of that name is an unrelated web toolkit.
"""

from setuptools import find_packages, setup

setup(
    name="megatron-endprompt",
    version="0.1.0",
    description="EndPrompt (terminal anchoring) long-context extension for Megatron-Core",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.12",
    packages=find_packages(include=["megatron_endprompt", "megatron_endprompt.*"]),
    install_requires=[
        "torch>=2.4",
        "megatron-core>=0.18,<0.21",
        "numpy>=1.26",
        "tqdm>=4.60",
        "sentencepiece>=0.2",
        "transformers>=4.45",
        "safetensors>=0.4",
        "psutil>=5.9",
        "wonderwords>=3.0",  # RULER's word lists (NIAH keys, common words)
    ],
    package_data={"megatron_endprompt.evaluation": ["assets/*.txt.gz", "assets/*.json"]},
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100"],
        # Transformer Engine comes from NVIDIA's wheels or the NGC container; apex is built
        # from source (github.com/NVIDIA/apex) - it is not the PyPI "apex".
        "gpu": ["transformer-engine[pytorch]>=2.0"],
        # lm-evaluation-harness (--backend lm-eval): hf = its HF model backend (accelerate),
        # ruler = its RULER tasks' generators; 0.4.13 is the tested version
        "lm-eval": ["lm-eval[hf,ruler]>=0.4.13"],
    },
    entry_points={
        "console_scripts": [
            "endprompt-preprocess=megatron_endprompt.cli.preprocess:cli",
            "endprompt-build-sidecar=megatron_endprompt.cli.build_sidecar:cli",
            "endprompt-merge=megatron_endprompt.cli.merge:cli",
            "endprompt-inspect=megatron_endprompt.cli.inspect:cli",
            "endprompt-convert=megatron_endprompt.cli.convert:cli",
            "endprompt-plan=megatron_endprompt.cli.plan:cli",
            "endprompt-eval=megatron_endprompt.cli.eval:cli",
            # training: one process per rank, e.g. `torchrun --no-python endprompt-pretrain ...`
            "endprompt-pretrain=megatron_endprompt.training.pretrain:main",
            "endprompt-launch-check=megatron_endprompt.cli.launch_check:cli",
            # the launch script's console filter (torchrun's output -> log file + quiet console)
            "endprompt-launch-console=megatron_endprompt.cli.launch_console:main",
            "endprompt-demo=megatron_endprompt.demo:cli",
        ]
    },
)
