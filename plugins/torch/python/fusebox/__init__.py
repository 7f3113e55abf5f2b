"""fusebox: gradient bucketing and tuned allreduce for data-parallel training.

The PyTorch entry point is ``fusebox.torch.register(ddp_model)``; the gradient
profile recorder is ``fusebox.record_profile`` (command: ``fusebox-record-profile``).
Importing this package imports neither torch nor the compiled extension.
"""


def _version_from_cmake():
    """The version in the top-level CMakeLists.txt's project(fusebox VERSION
    x.y.z), found above this file: for a source checkout (and the CMake
    build's copy of the package under build/python), where no _version.py
    was generated."""
    import os
    import re
    directory = os.path.dirname(os.path.abspath(__file__))
    for _ in range(6):
        directory = os.path.dirname(directory)
        try:
            with open(os.path.join(directory, "CMakeLists.txt"), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            continue
        m = re.search(r"^\s*project\s*\(\s*fusebox\s[^)]*?\bVERSION\s+([0-9]+(?:\.[0-9]+)*)",
                      text, re.MULTILINE | re.IGNORECASE)
        if m:
            return m.group(1)
    return "0+unknown"


try:
    # Written by setup.py (pip install) from the same CMakeLists.txt line.
    from ._version import __version__
except ImportError:
    __version__ = _version_from_cmake()
