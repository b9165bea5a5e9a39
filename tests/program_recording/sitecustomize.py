"""First on PYTHONPATH only while the suite records its programs (tests/program_recorder.py
puts it there): in every Python interpreter the tests start, installs the recorder when
``lowering`` is first imported, then runs the sitecustomize this one hides, if any."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _InstallAfterLowering(importlib.abc.MetaPathFinder):
    """Finds ``lowering`` as the other finders would, and has its loader install the
    recorder once the package has run (so ``from lowering import lower_fusion`` gets the
    recording one); then leaves sys.meta_path."""

    def find_spec(self, name, path=None, target=None):
        if name != "lowering":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from tests.program_recorder import install

            install()

        spec.loader.exec_module = exec_module
        return spec


def _run_hidden_sitecustomize():
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


if os.environ.get("HOSTIR_RECORD_PROGRAMS"):
    if "lowering" in sys.modules:  # not at startup, but if this is imported later
        from tests.program_recorder import install

        install()
    else:
        sys.meta_path.insert(0, _InstallAfterLowering())
_run_hidden_sitecustomize()
