# Only here for cffi_modules; all metadata lives in setup.cfg.
from setuptools import setup

setup(cffi_modules=["engined/_helper_build.py:ffibuilder"])
