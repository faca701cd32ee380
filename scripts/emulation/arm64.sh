#!/usr/bin/env bash
# `make run` on an emulated aarch64 CPU (an Apple Silicon, Graviton or Grace stand-in), where
# portable numerics cannot hold (torch's aarch64 builds have no MKL): numerics: auto must run every
# job natively after one line saying why, and `incofl compare` must give its statistical verdict.
#
# Run as root on an x86-64 Debian or Ubuntu machine (docs/testing.md, "On other CPUs and Pythons"):
#   scripts/emulation/arm64.sh ROOT RUN_DIR [CELL]
# ROOT (outside the checkout) gets a Debian 12 arm64 system (Python 3.11) by debootstrap, run
# through QEMU's user-mode emulation (binfmt_misc). The checkout's files (tracked and untracked,
# not ignored) are copied to ROOT/opt/incofl, where the Makefile makes the venv ROOT/opt/venv
# (kept between calls) from PyPI's aarch64 wheels, downloaded by this machine's pip into
# ROOT/wheels (pip under emulation takes long to download and hash 3 GB of CUDA libraries that the
# aarch64 torch 2.14.1 depends on). RUN_DIR and CELL: make-run.sh beside this file, run in the
# arm64 system (RUN_DIR inside it; CELL: one cell's three runs, e.g. digits/a0.5/FedAvg), with
# CORES (default 2) for Snakemake.
set -euo pipefail

root=${1:?usage: $0 ROOT RUN_DIR [CELL]}
run_dir=${2:?usage: $0 ROOT RUN_DIR [CELL]}
cell=${3:-}
checkout=$(cd "$(dirname "$0")/../.." && pwd)
pip=${PIP:-pip3}

command -v qemu-aarch64-static debootstrap update-binfmts > /dev/null ||
	apt-get install -y qemu-user-static debootstrap binfmt-support
[ -e /proc/sys/fs/binfmt_misc/register ] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64
[ -x "$root/usr/bin/python3" ] || debootstrap --arch arm64 --variant=minbase \
	--include=python3,python3-venv,python3-pip,ca-certificates,make bookworm "$root" http://deb.debian.org/debian
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"

# The aarch64 wheels of the project's pins (and pip's, for its build), for Debian 12's Python 3.11.
platforms=(--platform manylinux2014_aarch64 --platform linux_aarch64 --platform any)
for minor in $(seq 17 36); do platforms+=(--platform "manylinux_2_${minor}_aarch64"); done
mkdir -p "$root/wheels"
"$pip" download --quiet --only-binary=:all: --python-version 3.11 --implementation cp "${platforms[@]}" \
	--find-links "$root/wheels" -d "$root/wheels" "$checkout[test,flower]" pip setuptools wheel
rm -f "$root/wheels"/incofl-*

rm -rf "$root/opt/incofl" && mkdir -p "$root/opt/incofl"
(cd "$checkout" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c) | tar -x -C "$root/opt/incofl"
in_root=(chroot "$root" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root OMP_NUM_THREADS=1
	PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheels CORES="${CORES:-2}")

echo "arm64: $(chroot "$root" uname -m), $(chroot "$root" python3 --version)"
start=$(date +%s)
"${in_root[@]}" make -C /opt/incofl /opt/venv/bin/.installed VENV=/opt/venv
echo "venv: $(($(date +%s) - start)) s"
start=$(date +%s)
status=0
"${in_root[@]}" /opt/incofl/scripts/emulation/make-run.sh /opt/venv "$run_dir" "$cell" || status=$?
echo "exit code $status after $(($(date +%s) - start)) s"
exit "$status"
