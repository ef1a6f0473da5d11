"""Only what pyproject.toml cannot say: conf/ stays at the repository root (train.py and the README point
there) and is shipped inside the package as framework/conf, for normal and editable installs alike. Hydra finds
plugins only in the `hydra_plugins` namespace package, so hydra-dist's sweeper lives there."""
from setuptools import find_namespace_packages, setup

conf_packages = ["framework.conf"] + [f"framework.conf.{p}" for p in find_namespace_packages(where="conf")]

setup(
    packages=find_namespace_packages(include=["framework", "framework.*", "hydra_plugins.hydra_dist_sweepers"],
                                     exclude=["*.__pycache__"]) + conf_packages,
    package_dir={"framework.conf": "conf"},
    package_data={p: ["*.yaml"] for p in conf_packages},
)
