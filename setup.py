"""Package discovery: `libs/rallypoint` installs as `rallypoint`, `services/` as `rallypoint_services`.

pyproject.toml cannot map two source roots with `find`, so the mapping lives here.
"""

from setuptools import find_packages, setup

library = find_packages("libs", include=["rallypoint", "rallypoint.*"])
services = ["rallypoint_services"] + ["rallypoint_services." + name for name in find_packages("services")]

setup(
    packages=library + services,
    package_dir={"rallypoint": "libs/rallypoint", "rallypoint_services": "services"},
    package_data={"rallypoint": ["py.typed", "**/*.json", "**/*.yaml"]},
)
