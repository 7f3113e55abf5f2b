#!/bin/bash
# 4 local ranks (oversubscribed on 2 cores), 3 repeats: ../run.sh's A/B.
#   BEFORE=... AFTER=... RUN=build/tools/fusebox-run bash run.sh
here=$(cd "$(dirname "$0")" && pwd)
RANKS=4 REPEATS=3 SWEEP="-b 64K -e 32M -f 8 -n 10 -w 3" OUT="$here/raw" bash "$here/../run.sh"
