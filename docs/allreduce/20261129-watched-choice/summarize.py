#!/usr/bin/env python3
"""Medians over rounds of ab.sh's rows: ../20261129-ring-candidate/summarize.py, whose columns
this folder's runs share (old: the build before, new: the build under test).

usage: summarize.py FILE [...]
"""
import os
import runpy
import sys

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "20261129-ring-candidate", "summarize.py"), run_name="__main__")
