#!/bin/sh
# Vendors the dashboard's one third-party part, xterm.js and its fit addon,
# into internal/ui/static/vendor: the exact npm tarballs below, checked
# against their sha512 (the registry's integrity), unpacked, and only the
# built files the dashboard loads copied. The result is committed, so that
# `go build` needs no npm; rerunning this gives the same bytes.
set -eu
cd "$(dirname "$0")/.."
out=internal/ui/static/vendor
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name@version, the tarball's sha512 (base64, as npm's "integrity"), and the
# files of the package to keep (from its package/ directory) as dest=src.
fetch() {
	spec=$1 sum=$2
	shift 2
	(cd "$tmp" && npm pack --silent "$spec" >"$tmp/name")
	tgz="$tmp/$(cat "$tmp/name")"
	got=$(node -e 'process.stdout.write(require("crypto").createHash("sha512").update(require("fs").readFileSync(process.argv[1])).digest("base64"))' "$tgz")
	if [ "$got" != "$sum" ]; then
		echo "ui-vendor.sh: $spec: sha512 $got, want $sum" >&2
		exit 1
	fi
	dir="$tmp/$(basename "$tgz" .tgz)"
	mkdir -p "$dir"
	tar -xzf "$tgz" -C "$dir"
	for pair in "$@"; do
		cp "$dir/package/${pair#*=}" "$out/${pair%%=*}"
	done
	cp "$dir/package/LICENSE" "$out/$(basename "$tgz" .tgz).LICENSE"
}

mkdir -p "$out"
fetch @xterm/xterm@6.0.0 \
	TQwDdQGtwwDt+2cgKDLn0IRaSxYu1tSUjgKarSDkUM0ZNiSRXFpjxEsvc/Zgc5kq5omJ+V0a8/kIM2WD3sMOYg== \
	xterm.js=lib/xterm.js xterm.css=css/xterm.css
fetch @xterm/addon-fit@0.11.0 \
	jYcgT6xtVYhnhgxh3QgYDnnNMYTcf8ElbxxFzX0IZo+vabQqSPAjC3c1wJrKB5E19VwQei89QCiZZP86DCPF7g== \
	addon-fit.js=lib/addon-fit.js
# The built files end with a source map comment whose map is not shipped.
for f in "$out/xterm.js" "$out/addon-fit.js"; do
	sed -i '/^\/\/# sourceMappingURL=/d' "$f"
done
(cd "$out" && sha256sum xterm.js xterm.css addon-fit.js >SHA256SUMS)
echo "ui-vendor.sh: vendored into $out"
