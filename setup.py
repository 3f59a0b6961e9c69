"""What pyproject.toml cannot say: the shipped models (pretrained/) and presets (configs/) stay at
the top of the repository, where the README's commands name them, and go into the wheel as
imagetx/pretrained/ and imagetx/configs/, so that an installed imagetx (pip install ., not
editable) samples, runs its demo and trains with them (imagetx/cli/shipped.py finds either).
The models' training history (lineage/: lineages, lease logs, continuations) is named nowhere here
and stays out of the wheel.
Every folder of data is named as a package of its own: setuptools installs files only of the
packages it is told of (and warns about folders it would otherwise guess at)."""

from pathlib import Path

from setuptools import find_packages, setup

DATA = {"imagetx.pretrained": "pretrained", "imagetx.configs": "configs"}  # package: folder
DATA.update({f"{package}.{sub.name}": str(sub) for package, folder in list(DATA.items())
             for sub in sorted(Path(folder).iterdir()) if sub.is_dir()})  # pretrained/completion, ...
EXAMPLES = "imagetx.demo.examples"  # the demo's example pictures, inside the package already

setup(
    packages=[*find_packages(include=["imagetx*"]), EXAMPLES, *DATA],
    package_dir=DATA,
    package_data={package: ["*"] for package in [EXAMPLES, *DATA]},
)
