package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/tlsca"
)

// dataDir is the server's data directory (--data); its methods name every
// path in it, so that the layout is written down in one place.
type dataDir string

func (d dataDir) path(elem ...string) string {
	return filepath.Join(append([]string{string(d)}, elem...)...)
}

// Store is the SQLite database.
func (d dataDir) Store() string { return d.path("atoll.db") }

// Layers is the layer store: template layers, snapshots, writable layers.
func (d dataDir) Layers() string { return d.path("layers") }

// Bin holds the installed agent binary.
func (d dataDir) Bin() string { return d.path("bin") }

// Lowers holds the template layer images the ns and gvisor runtimes share.
func (d dataDir) Lowers() string { return d.path("lowers") }

// OldLowers are where earlier versions kept layer images, discarded at start.
func (d dataDir) OldLowers() []string {
	return []string{d.path("run", "lowers"), d.path("run-gvisor", "lowers")}
}

// Run is a runtime's state directory: "run" for ns, "run-<name>" for the
// others.
func (d dataDir) Run(runtime string) string {
	if runtime == "ns" {
		return d.path("run")
	}
	return d.path("run-" + runtime)
}

// Checkpoints holds the memory images of suspended sandboxes.
func (d dataDir) Checkpoints() string { return d.path("checkpoints") }

// Archive is the default archive store.
func (d dataDir) Archive() string { return d.path("archive") }

// Vaults is the local cache of memory vaults' repositories (their truth
// is in the store and the archive store) and their hook's socket.
func (d dataDir) Vaults() string { return d.path("vaults") }

// PortKey is the key that signs port URLs.
func (d dataDir) PortKey() string { return d.path("port-key") }

// E2BTokenKey is the key of the E2B API's access tokens.
func (d dataDir) E2BTokenKey() string { return d.path("e2b-token-key") }

// URL is the file with the API's URL, for the local CLI; TLSURL its HTTPS
// one.
func (d dataDir) URL() string    { return d.path("url") }
func (d dataDir) TLSURL() string { return d.path("tls-url") }

// APIKey is the file with the first API key, the admin's, for the local
// CLI.
func (d dataDir) APIKey() string { return d.path("api-key") }

// CA is the directory of the local certificate authority (tlsca.Load), and
// CACert its certificate, for clients to trust.
func (d dataDir) CA() string     { return string(d) }
func (d dataDir) CACert() string { return d.path(tlsca.CertFile) }

// openDataDir makes the data directory at path if need be and checks that
// sandboxes can reach it.
func openDataDir(path string) (dataDir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	// 0711: sandboxes' unprivileged host uids traverse it to reach the agent
	// binary and their mountpoints; nothing in it is listable or readable.
	if err := os.MkdirAll(abs, 0o711); err != nil {
		return "", err
	}
	if err := os.Chmod(abs, 0o711); err != nil {
		return "", err
	}
	if err := checkTraversable(abs); err != nil {
		return "", err
	}
	// The ns runtime, which every server offers, must fit its sockets; the
	// others are checked as they are offered.
	d := dataDir(abs)
	if err := checkSocketPath(ns.SocketPath(d.Run("ns"), strings.Repeat("x", api.SandboxIDLen))); err != nil {
		return "", fmt.Errorf("--data %s: %w", abs, err)
	}
	return d, nil
}

// VaultTokenKey is the key of the tokens of vaults mounted in sandboxes.
func (d dataDir) VaultTokenKey() string { return d.path("vault-token-key") }
