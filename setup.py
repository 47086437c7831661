"""Packaging for tb-introspect.

The build step bundles the frontend (``frontend/`` -> ``tb_introspect/static/``)
with npm when Node.js is present; a wheel ships the bundle.
"""

import os
import shutil
import subprocess

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
FRONTEND = os.path.join(HERE, "frontend")


class BuildWithFrontend(build_py):
    """Runs the npm build of the frontend before collecting package files."""

    def run(self):
        if os.path.exists(os.path.join(FRONTEND, "package.json")):
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
    version="0.1.0",
    description="TensorBoard plugin: see inside a neural network while it trains",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # Namespace discovery so the built bundle (tb_introspect/static, no __init__.py) ships as data.
    packages=find_namespace_packages(include=["tb_introspect", "tb_introspect.*"]),
    package_data={"tb_introspect.static": ["*"], "tb_introspect.proto": ["*.proto"]},
    include_package_data=True,
    install_requires=[
        "tensorboard>=2.16,<2.22",
        "numpy>=1.24,<3",
        "protobuf>=6.31.1,<8",
        "tqdm>=4.66,<5",
    ],
    extras_require={
        # The writer side. TensorBoard itself runs the plugin without TensorFlow.
        "tf": ["tensorflow>=2.16,<2.22"],
        "tf-cpu": ["tensorflow-cpu>=2.16,<2.22"],
        "demo": ["scikit-learn>=1.3,<2"],
        "test": [
            "pytest>=8,<10",
            "hypothesis>=6.100,<7",
            "playwright>=1.45,<2",
            "ruff==0.17.5",
            "scikit-learn>=1.3,<2",
        ],
        # tfp also needs tf-keras, whose own requirement on `tensorflow` would install a second
        # TensorFlow over tensorflow-cpu: the Makefile installs tf-keras with --no-deps.
        "bench": ["tensorflow-probability>=0.24,<0.26"],
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
