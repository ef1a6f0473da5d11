"""Only what pyproject.toml cannot say: conf/ stays at the repository root (train.py and the README point
there) and is shipped inside the package as framework/conf, for normal and editable installs alike."""
from setuptools import find_namespace_packages, setup

conf_packages = ["framework.conf"] + [f"framework.conf.{p}" for p in find_namespace_packages(where="conf")]

setup(
    packages=find_namespace_packages(include=["framework", "framework.*"], exclude=["*.__pycache__"]) + conf_packages,
    package_dir={"framework.conf": "conf"},
    package_data={p: ["*.yaml"] for p in conf_packages},
)
