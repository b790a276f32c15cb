"""normplug: normalization research for fairseq Transformers, as a --user-dir plugin."""
from setuptools import find_packages, setup

# fairseq's runtime dependencies, declared here because fairseq itself is installed after them with
# --no-deps: both builds (fairseq-fixed==0.12.3.1 on Python >= 3.11, fairseq==0.12.2 below) declare
# torchaudio, which pulls a second multi-GB torch. README, "Using it from your own environment":
#   pip install -e ".[fairseq]" && pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
# numpy<2: fairseq 0.12 has run here with numpy 1.26 only, and its Cython extensions, built against the
# numpy present (pip's wheel cache keeps them), do not load under another major version. setuptools
# builds those extensions (--no-build-isolation: the build imports the torch already installed).
FAIRSEQ_RUNTIME = [
    "numpy>=1.21.3,<2", "cffi", "cython", "regex", "tqdm", "bitarray", "scikit-learn",
    "setuptools>=70.1",
    'hydra-core==1.3.2; python_version >= "3.11"', 'omegaconf==2.3.0; python_version >= "3.11"',
    'hydra-core>=1.0.7,<1.1; python_version < "3.11"', 'omegaconf<2.1; python_version < "3.11"',
]

setup(
    name="normplug",
    version="0.2.0",
    description=(
        "fairseq plugin: BatchNorm, Regularized BN, LayerNorm variants and "
        "PowerNorm for NMT Transformers (--user-dir normplug)"
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["normplug", "normplug.*"]),
    # what the installed package imports: the plugin, its tools and the recipe driver (fairseq
    # aside, see above); the data scripts' packages are in requirements.txt. matplotlib only
    # draws normplug-tid --plot. torch 2.4 brought torch.library.custom_op, which wraps the
    # fused kernels (normplug/norms/triton_*.py). sentencepiece: fairseq's --bpe sentencepiece, for
    # a researcher's own corpus. packaging: the tools' check of what fairseq needs.
    install_requires=["torch>=2.4", "PyYAML", "sacrebleu>=2.3", "sacremoses", "sentencepiece", "packaging"],
    extras_require={"fairseq": FAIRSEQ_RUNTIME, "plot": ["matplotlib"],
                    "test": ["pytest", "pytest-xdist", "hypothesis"]},
    entry_points={
        "console_scripts": [
            "normplug-path = normplug.tools.path:main",
            "normplug-tid = normplug.tools.tid:main",
            "normplug-average = normplug.tools.average:main",
            "normplug-recipe = normplug.recipes.cli:main",
        ]
    },
)
