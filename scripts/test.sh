#!/bin/sh
# Runs atoll's tests on a Debian machine with Go, as root: installs the Debian
# packages the tests use, then vets and tests every package. CI runs it with
# ATOLL_TEST_STRICT=1, which turns "skipped: needs X" into a failure.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
	echo "test.sh: run as root: the tests create namespaces, cgroups and mounts" >&2
	exit 1
fi
export PATH="$PATH:/usr/local/go/bin"
need=""
for p in btrfs-progs python3 git iproute2 util-linux procps debootstrap; do
	dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
# node and npm run the official e2b SDK against atoll (cmd/atoll/e2b_test.go,
# which needs node 20.18 or later); any install of them will do.
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
if [ -n "$need" ]; then
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
fi
# atoll and its agent are static Go binaries: the agent runs inside sandboxes.
export CGO_ENABLED=0
go vet ./...
go test -count=1 -timeout 40m "$@" ./...
