"""Build hooks of gyre-client: the generated modules (gyre/v1/*_pb2*.py and
gyre_client/_wire_pb2.py) are written by generate.py before anything is
collected, and an sdist carries a copy of the proto files (`proto/`), so a
wheel built from it needs no gyre checkout. Metadata is in pyproject.toml."""
import pathlib
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate  # noqa: E402

_done = []


def ensure_generated() -> None:
    if not _done:
        generate.generate(HERE)
        _done.append(True)


class BuildPy(build_py):
    def run(self):
        ensure_generated()
        super().run()


class EggInfo(egg_info):
    def run(self):
        ensure_generated()
        super().run()


class Sdist(sdist):
    def run(self):
        ensure_generated()
        super().run()

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        src = generate.find_proto_dir()
        shutil.copytree(src, pathlib.Path(base_dir) / "proto", dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("*.rs"))


setup(cmdclass={"build_py": BuildPy, "egg_info": EggInfo, "sdist": Sdist})
