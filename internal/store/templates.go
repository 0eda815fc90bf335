package store

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Templates are names that point to versions. A version is immutable: its
// ID is a hash of what it is made of (the name it was made under, its layers
// and its settings), and every sandbox and snapshot records the version it
// was made from. A build or import under a name records a new version and
// moves the name to it in one transaction. A version is held by the names
// that point to it and by the sandboxes (in any state, archived too) and
// snapshots made from it; CollectTemplates deletes those nothing holds, and
// nothing else deletes versions, so the store is the one place that counts
// references.

// Template is one version of a template.
type Template struct {
	ID        string // VersionID of Name, Layers and Config
	Name      string // the name it was made under
	Number    int    // its place among Name's versions, from 1
	Source    string
	Digest    string
	Layers    []string // bottom first
	Size      int64
	Config    TemplateConfig
	CreatedAt time.Time
}

// TemplateConfig is what a template's image says about its processes.
type TemplateConfig struct {
	// Base is "host" for a template built FROM the host template: its
	// layers stack on the host template's. Empty for images.
	Base       string   `json:"base,omitempty"`
	Env        []string `json:"env,omitempty"`
	Workdir    string   `json:"workdir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	StartCmd   string   `json:"start_cmd,omitempty"`
	ReadyCmd   string   `json:"ready_cmd,omitempty"`
	PoolSize   int      `json:"pool_size,omitempty"` // sandboxes kept started ahead of demand
	// Setuid lets setuid programs raise privileges (LABEL atoll.setuid).
	Setuid bool `json:"setuid,omitempty"`
	// Blobs are, in a cluster, the sha256 (hex) of each layer's tar in
	// the object store, by layer ID: the object is
	// templates.LayerKey(digest), and a node that pulls it checks the
	// digest. It is where the layers are, not what the version is:
	// VersionID leaves it out.
	Blobs map[string]string `json:"blobs,omitempty"`
}

// TemplateName is a name and the version it points to.
type TemplateName struct {
	Name    string
	Current Template
}

// VersionUse counts what holds a version besides names.
type VersionUse struct {
	Sandboxes, Snapshots int
}

// VersionUses puts together the counts, by version, of the sandboxes and
// of the snapshots made from each.
func VersionUses(sandboxes, snapshots map[string]int) map[string]VersionUse {
	out := map[string]VersionUse{}
	for id, n := range sandboxes {
		out[id] = VersionUse{Sandboxes: n}
	}
	for id, n := range snapshots {
		u := out[id]
		u.Snapshots = n
		out[id] = u
	}
	return out
}

// VersionID is the ID of the version of name made of layers (bottom first)
// with settings cfg: "v" and 19 hex digits of their hash, so that an ID
// never reads as a version number.
func VersionID(name string, layers []string, cfg TemplateConfig) string {
	cfg.Blobs = nil
	c, _ := json.Marshal(cfg)
	h := sha256.New()
	for _, p := range append([]string{name, string(c)}, layers...) {
		fmt.Fprintf(h, "%d:%s\x00", len(p), p)
	}
	return "v" + hex.EncodeToString(h.Sum(nil))[:19]
}

// ValidVersionID reports whether id has the shape VersionID gives.
func ValidVersionID(id string) bool {
	if len(id) != 20 || id[0] != 'v' {
		return false
	}
	for i := 1; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
