#!/usr/bin/env python3
"""The gradient-profile recorder, from a source checkout: a thin wrapper.

The code lives in the package, ``fusebox.record_profile`` (next to this file
in fusebox/record_profile.py; installed by ``pip install .`` with the console
script ``fusebox-record-profile``). This file keeps the old entry points
working without installing anything:

    /usr/bin/python3 plugins/torch/python/fusebox_record_profile.py --model cnn -o cnn.json

    import fusebox_record_profile          # with plugins/torch/python on sys.path
    fusebox_record_profile.record_profile(model, make_batch)
"""
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load():
    if _HERE not in sys.path:
        sys.path.insert(0, _HERE)
    try:
        from fusebox import record_profile
        return record_profile
    except ImportError:
        # `fusebox` was already imported from a tree without the recorder
        # (the CMake build's build/python carries only the DDP hook): load
        # the file beside this one. It imports nothing from the package.
        path = os.path.join(_HERE, "fusebox", "record_profile.py")
        spec = importlib.util.spec_from_file_location("fusebox.record_profile", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


_impl = _load()
globals().update({name: getattr(_impl, name) for name in _impl.__all__})
__all__ = list(_impl.__all__)

if __name__ == "__main__":
    sys.exit(_impl.main())
