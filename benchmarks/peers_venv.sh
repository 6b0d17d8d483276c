#!/usr/bin/env bash
# A venv of its own for the peers benchmarks/peers.py times: learn2learn 0.2.0 and higher 0.2.1
# beside torch 2.13 (CPU). learn2learn's sdist ships C files from an old Cython and its wheels
# stop at old Pythons, so it is built from the sdist with a current Cython.
#     bash benchmarks/peers_venv.sh l2l-venv && python benchmarks/peers.py --peer-python l2l-venv/bin/python
set -euo pipefail
V=$(realpath -m "${1:-l2l-venv}")
python3 -m venv "$V"
"$V/bin/pip" install -q torch==2.13.0 numpy scipy cython pillow requests tqdm gym
"$V/bin/pip" install -q --no-deps higher==0.2.1
d=$(mktemp -d)
"$V/bin/pip" download -q --no-deps --no-binary :all: -d "$d" learn2learn==0.2.0
tar xzf "$d"/learn2learn-0.2.0.tar.gz -C "$d"
(cd "$d/learn2learn-0.2.0" && rm -rf .eggs && find . -name "*.c" -path "./learn2learn/*" -delete &&
 sed -i "s/use_cython = 'develop' in sys.argv or 'build_ext' in sys.argv/use_cython = True/" setup.py &&
 "$V/bin/pip" install -q --no-build-isolation --no-deps .)
rm -rf "$d"
echo "peers venv ready: $V/bin/python"
