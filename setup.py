"""lossscale: safe float16 loss scaling for MindSpore on every backend."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "lossscale", "__init__.py"), encoding="utf-8") as handle:
    VERSION = re.search(r'^__version__ = "([^"]+)"', handle.read(), re.M).group(1)

setup(
    name="lossscale",
    version=VERSION,
    description="Loss scaling for float16 mixed-precision training with MindSpore on CPU, GPU and Ascend",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # Tested: MindSpore 2.7.1 on Python 3.9 and 2.10.0 on Python 3.11 in CI (.ci/run); 2.7.1, 2.7.2, 2.8.0, 2.9.0
    # and 2.10.0 on Python 3.11 and 2.9.0 on Python 3.9 by hand. 2.7.0 crashes (README).
    python_requires=">=3.9,<3.12",
    # The repository's models/ folder (demo networks and data) is installed as lossscale_models: nothing
    # goes under a generic top-level name that a user's own models.py or models/ would clash with.
    packages=find_packages(include=["lossscale", "lossscale.*"]) + ["lossscale_models"],
    package_dir={"lossscale_models": "models"},
    package_data={"lossscale_models": ["data/*.csv.gz", "data/*.md", "data/*.txt"]},
    install_requires=[
        "mindspore>=2.7.1,<2.11",
        "numpy>=1.21,<2",
    ],
    extras_require={
        # The demo (python -m lossscale: progress bars and plots); the library never imports it.
        "demo": ["tqdm>=4.40", "matplotlib>=3.5"],
        "plot": ["matplotlib>=3.5"],
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6", "tqdm>=4.40", "matplotlib>=3.5", "psutil>=5"],
    },
    entry_points={"console_scripts": ["lossscale=lossscale.__main__:main"]},
    license="Apache-2.0",
)
