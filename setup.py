"""lossscale: safe float16 loss scaling for MindSpore on every backend."""
from setuptools import find_packages, setup

setup(
    name="lossscale",
    version="0.1.0",
    description="Loss scaling for float16 mixed-precision training with MindSpore on CPU, GPU and Ascend",
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=["lossscale", "lossscale.*", "models", "models.*"]),
    package_data={"models": ["data/*.csv.gz", "data/*.md", "data/*.txt"]},
    install_requires=[
        "mindspore>=2.3,<2.12",
        "numpy>=1.21,<2",
        "tqdm>=4.40",
    ],
    extras_require={
        "plot": ["matplotlib>=3.5"],
        "test": ["pytest>=7", "hypothesis>=6", "matplotlib>=3.5", "psutil>=5"],
    },
    entry_points={"console_scripts": ["lossscale=lossscale.__main__:main"]},
    license="Apache-2.0",
)
