#!/usr/bin/env bash
# Install what the sandbox for model-written code needs (ajet/sandbox, docs/sandbox.md):
# Debian's bubblewrap. Then check that it can create its namespaces here.
set -euo pipefail

if ! command -v bwrap >/dev/null; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    if command -v apt-get >/dev/null; then
        $SUDO apt-get update -q
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends bubblewrap
    elif command -v dnf >/dev/null; then
        $SUDO dnf install -y bubblewrap
    else
        echo "install bubblewrap (the 'bwrap' command) with this system's package manager" >&2
        exit 1
    fi
fi
bwrap --version
binds=(--ro-bind /usr /usr)
for top in /bin /lib /lib64; do
    if [ -L "$top" ]; then binds+=(--symlink "$(readlink "$top")" "$top"); elif [ -d "$top" ]; then binds+=(--ro-bind "$top" "$top"); fi
done
bwrap --unshare-all --die-with-parent "${binds[@]}" /bin/true || { echo "bubblewrap is installed but cannot create namespaces here: see docs/sandbox.md" >&2; exit 1; }
