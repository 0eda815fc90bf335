"""Installs deno into /usr/local/bin, for the code interpreter's JavaScript
and TypeScript contexts: deno has a Jupyter kernel built in (deno jupyter),
which is what E2B's template runs for them too. The other JavaScript
kernels need npm's native ZeroMQ builds; deno is one static binary.

It comes from the npm registry ($NPM_REGISTRY; the template's ARG): the
package @deno/linux-<arch>-glibc, which npm's "deno" package installs, its
tarball checked against the integrity the registry published for it
(pinned here). With NPM_REGISTRY empty nothing is installed and the
template has no JavaScript.
"""

import base64
import hashlib
import io
import os
import platform
import sys
import tarfile
import time
import urllib.request

VERSION = "2.9.6"
# npm's dist.integrity of each build: npm view @deno/linux-x64-glibc@VERSION dist.integrity
INTEGRITY = {
    "x64": "sha512-3md4TKLCuzsLDmfOoC5KN7NAZaxSVkMgm64vg6foD00JBADCpYS2/5QqXfzgnP5ZQz3iLP9vBQJtEgc116OAoQ==",
    "arm64": "sha512-poqhoH9B3nYloigEMPT5t8HY+wBeiuea1An5Q7fqgJzP0SYmWsoS/oUnWO/pEiA4ofzIBy1Elt/in58xKtxEoQ==",
}
ARCH = {"x86_64": "x64", "aarch64": "arm64"}
DEST = "/usr/local/bin/deno"


def main():
    registry = os.environ.get("NPM_REGISTRY", "https://registry.npmjs.org").rstrip("/")
    if not registry:
        print("NPM_REGISTRY is empty: no deno, no JavaScript contexts")
        return
    arch = ARCH.get(platform.machine())
    if arch is None:
        sys.exit("no deno build for %s" % platform.machine())
    pkg = "linux-%s-glibc" % arch
    url = "%s/@deno/%s/-/%s-%s.tgz" % (registry, pkg, pkg, VERSION)
    t0 = time.monotonic()
    with urllib.request.urlopen(url, timeout=300) as r:
        tgz = r.read()
    got = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    if got != INTEGRITY[arch]:
        sys.exit("%s: integrity %s, want %s" % (url, got, INTEGRITY[arch]))
    with tarfile.open(fileobj=io.BytesIO(tgz)) as tf:
        src = tf.extractfile("package/deno")
        with open(DEST + ".tmp", "wb") as out:
            out.write(src.read())
    os.chmod(DEST + ".tmp", 0o755)
    os.rename(DEST + ".tmp", DEST)
    print("deno %s from %s (%d MB download, %d MB installed, %.1f s)"
          % (VERSION, url, len(tgz) >> 20, os.path.getsize(DEST) >> 20, time.monotonic() - t0))


if __name__ == "__main__":
    main()
