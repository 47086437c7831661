"""Packaging for tb-introspect.

The build step bundles the frontend (``frontend/`` -> ``tb_introspect/static/``)
with npm when Node.js is present; a wheel ships the bundle.
"""

import os
import re
import shutil
import subprocess

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
FRONTEND = os.path.join(HERE, "frontend")


def read_version() -> str:
    """``__version__`` of ``tb_introspect/__init__.py``, the one place the version is written."""
    with open(os.path.join(HERE, "tb_introspect", "__init__.py"), encoding="utf-8") as f:
        match = re.search(r'^__version__ = "([^"]+)"', f.read(), re.M)
    if match is None:
        raise RuntimeError("tb_introspect/__init__.py does not define __version__")
    return match.group(1)


class BuildWithFrontend(build_py):
    """Runs the npm build of the frontend before collecting package files."""

    def run(self):
        # A second environment over the same checkout (make test-oldest) reuses the bundle.
        skip = os.environ.get("TB_INTROSPECT_SKIP_FRONTEND") == "1" and os.path.exists(
            os.path.join(HERE, "tb_introspect", "static", "index.js"))
        if not skip and os.path.exists(os.path.join(FRONTEND, "package.json")):
            npm = shutil.which("npm")
            if npm is None:
                if not os.path.exists(os.path.join(HERE, "tb_introspect", "static", "index.js")):
                    raise RuntimeError(
                        "tb-introspect: Node.js/npm is needed to build the frontend"
                        " (frontend/ -> tb_introspect/static/); install Node.js >= 18"
                    )
            else:
                if not os.path.isdir(os.path.join(FRONTEND, "node_modules")):
                    subprocess.check_call([npm, "ci", "--no-audit", "--no-fund"], cwd=FRONTEND)
                subprocess.check_call([npm, "run", "build"], cwd=FRONTEND)
        super().run()


setup(
    name="tb-introspect",
    version=read_version(),
    description="TensorBoard plugin: see inside a neural network while it trains",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # Namespace discovery so the built bundle (tb_introspect/static, no __init__.py) ships as data.
    packages=find_namespace_packages(include=["tb_introspect", "tb_introspect.*"]),
    package_data={"tb_introspect.static": ["*"], "tb_introspect.proto": ["*.proto"]},
    include_package_data=True,
    # The checked-in protobuf gencode needs protobuf >= 6.31.1, which TensorFlow allows from
    # 2.20 on; TensorFlow 2.20 needs Keras >= 3.10. `make test-oldest` tests the lower ends.
    install_requires=[
        "tensorboard>=2.20,<2.22",
        "numpy>=1.24,<3",
        "protobuf>=6.31.1,<8",
        # The event files' CRC-32C in C (TensorBoard's record writer computes it in Python).
        "google-crc32c>=1.5,<2",
        # numpy's BLAS held to one thread while a point is built on the host.
        "threadpoolctl>=3.1,<4",
    ],
    extras_require={
        # The writer side. TensorBoard itself runs the plugin without TensorFlow.
        "tf": ["tensorflow>=2.20,<2.22", "keras>=3.10,<3.16"],
        "tf-cpu": ["tensorflow-cpu>=2.20,<2.22", "keras>=3.10,<3.16"],
        # The PyTorch writer side (tb_introspect.torch); the CPU build is enough for the tests.
        "torch": ["torch>=2.4,<2.14"],
        # The JAX writer side (tb_introspect.jax): Flax's nnx.capture, optax in the examples.
        "jax": ["jax>=0.10,<0.11", "flax>=0.12.8,<0.13", "optax>=0.2.8,<0.3"],
        "demo": ["scikit-learn>=1.3,<2", "tqdm>=4.66,<5"],
        # Writing to and reading from buckets: s3:// through boto3, other URLs through fsspec.
        "s3": ["boto3>=1.34,<2"],
        "gcs": ["gcsfs>=2024.2"],
        # The trainer integrations (tb_introspect.transformers, tb_introspect.lightning).
        "transformers": ["transformers>=4.46,<6", "accelerate>=1.1,<2"],
        "lightning": ["lightning>=2.4,<3"],
        "test": [
            "pytest>=8,<10",
            "pytest-xdist>=3.6.1,<4",
            "filelock>=3.12,<5",
            "hypothesis>=6.100,<7",
            "playwright>=1.45,<2",
            "ruff==0.17.5",
            "scikit-learn>=1.3,<2",
            # A real S3-compatible server on 127.0.0.1 for the bucket tests.
            "moto[server]==5.2.5",
        ],
        # tfp also needs tf-keras, whose own requirement on `tensorflow` would install a second
        # TensorFlow over tensorflow-cpu: the Makefile installs tf-keras with --no-deps.
        "bench": ["tensorflow-probability>=0.24,<0.26", "wandb>=0.31,<0.32"],
    },
    entry_points={
        "tensorboard_plugins": [
            "introspect = tb_introspect.plugin.introspect_plugin:IntrospectLoader",
        ],
        "console_scripts": ["tb-introspect = tb_introspect.cli:main"],
    },
    cmdclass={"build_py": BuildWithFrontend},
    classifiers=[
        "Framework :: TensorFlow",
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
