"""normplug: normalization research for fairseq Transformers, as a --user-dir plugin."""
import sys

from setuptools import find_packages, setup

# fairseq is not pulled in by default: both builds declare torchaudio, which
# drags a second multi-GB torch in. scripts/setup-env.sh installs the right one
# with --no-deps; `pip install -e .[fairseq]` is there for those who want pip to.
FAIRSEQ = (
    "fairseq-fixed==0.12.3.1" if sys.version_info >= (3, 11) else "fairseq==0.12.2"
)

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
    # fused kernels (normplug/norms/triton_*.py).
    install_requires=["torch>=2.4", "PyYAML", "sacrebleu>=2.3", "sacremoses"],
    extras_require={"fairseq": [FAIRSEQ], "plot": ["matplotlib"], "test": ["pytest", "pytest-xdist", "hypothesis"]},
    entry_points={
        "console_scripts": [
            "normplug-path = normplug.tools.path:main",
            "normplug-tid = normplug.tools.tid:main",
            "normplug-average = normplug.tools.average:main",
            "normplug-recipe = normplug.recipes.cli:main",
        ]
    },
)
