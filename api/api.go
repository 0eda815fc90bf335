// Package api holds atoll's wire types: the JSON bodies of the REST API under /v1
// and of the in-sandbox agent protocol, which the server forwards unchanged.
// It has no logic; the server, CLI and SDKs share it. openapi.yaml describes the
// same shapes and a test keeps the two in step.
package api

import (
	"encoding/json"
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateStarting = "starting"
	StateRunning  = "running"
	StateStopping = "stopping"
	StatePaused   = "paused"
	// A suspended sandbox's memory and processes are saved to disk and
	// nothing of it runs; resume restores it, its processes going on.
	StateSuspending = "suspending"
	StateSuspended  = "suspended"
	// A shelved sandbox was paused without its memory: its processes
	// ended, its files are kept, and resume boots it again over them.
	StateShelved   = "shelved"
	StateStopped   = "stopped"
	StateArchiving = "archiving"
	StateArchived  = "archived" // files in object storage, local disk freed
	StateDeleting  = "deleting"
	StateDeleted   = "deleted" // only in the answer to a stop of an ephemeral sandbox
	StateError     = "error"
	// A lost sandbox was on a cluster node whose lease expired: the node
	// is fenced, and the sandbox can be restored on another node from the
	// latest state that reached object storage.
	StateLost = "lost"
)

// Sandbox is a sandbox as the API reports it.
type Sandbox struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	Template string `json:"template"`
	// TemplateVersion is the ID of the version of Template it was made
	// from, which it keeps across restarts, archives and forks however
	// often the template is rebuilt; empty for the built-in template.
	TemplateVersion string            `json:"template_version,omitempty"`
	Runtime         string            `json:"runtime"`
	CPU             float64           `json:"cpu"`        // cores
	MemoryMiB       int64             `json:"memory_mib"` // no swap
	DiskGiB         int64             `json:"disk_gib"`   // writable layer quota
	PIDs            int64             `json:"pids"`       // max processes
	Env             map[string]string `json:"env,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	Error           string            `json:"error,omitempty"` // why it is in state error or lost
	CreatedAt       time.Time         `json:"created_at"`
	StartedAt       *time.Time        `json:"started_at,omitempty"`
	// StoppedAt is when it last stopped; for a lost sandbox, when its
	// node was fenced.
	StoppedAt *time.Time `json:"stopped_at,omitempty"`
	// Lifecycle policies; see CreateSandboxRequest.
	ExpiresAt      *time.Time `json:"expires_at,omitempty"` // when the timeout stops it
	Ephemeral      bool       `json:"ephemeral,omitempty"`
	AutoDeleteSec  int64      `json:"auto_delete_sec,omitempty"`
	AutoStopSec    int64      `json:"auto_stop_sec,omitempty"`
	AutoArchiveSec int64      `json:"auto_archive_sec,omitempty"`
	AutoResume     bool       `json:"auto_resume,omitempty"`
	// CheckpointEverySec: see CreateSandboxRequest.
	CheckpointEverySec int64 `json:"checkpoint_every_sec,omitempty"`
	// CheckpointedAt is when its latest checkpoint was taken (the object
	// in object storage is whole).
	CheckpointedAt *time.Time `json:"checkpointed_at,omitempty"`
	// RestoredFrom is set in the answer to a start that restored a lost
	// sandbox on another node: "archive", or "checkpoint TIME" (RFC 3339)
	// of the checkpoint its files came from. The move's transition says
	// the same.
	RestoredFrom string `json:"restored_from,omitempty"`
	// Progress is set while the sandbox's files move to or from the archive
	// store.
	Progress *Progress `json:"progress,omitempty"`
	// Network is the sandbox's network: its addresses and egress policy.
	// Absent when the server runs sandboxes without networking (loopback
	// only).
	Network *SandboxNetwork `json:"network,omitempty"`
	// Ports says who may open the sandbox's ports through the server's port
	// proxy.
	Ports PortAccess `json:"ports"`
	// Node is the cluster node that runs it; absent on a single machine.
	Node string `json:"node,omitempty"`
	// Vaults are the memory vaults cloned into it at its creation (with
	// Path always set); a fork has its parent's.
	Vaults []VaultMount `json:"vaults,omitempty"`
	// TemplatePull is in a create's answer only, when the node that runs
	// the sandbox first fetched its template's layers from the cluster's
	// object store: that time is part of the create's.
	TemplatePull *TemplatePull `json:"template_pull,omitempty"`
	// SnapshotPull is in a create's answer only, when the node that runs
	// the sandbox fetched the archived snapshot it is made from from the
	// cluster's object store: that time is part of the create's.
	SnapshotPull *SnapshotPull `json:"snapshot_pull,omitempty"`
	// Placement is how the cluster chose Node: only in the answer to a
	// create that asked for it (CreateSandboxRequest.Explain), and only
	// if the scheduler placed it. GET /v1/sandboxes/{id}/placement shows
	// it later.
	Placement *Placement `json:"placement,omitempty"`
}

// TemplatePull is what a create waited for while its node fetched the
// template's layers it lacked (or waited for a concurrent fetch of them).
type TemplatePull struct {
	Layers int     `json:"layers"`
	Bytes  int64   `json:"bytes"`
	MS     float64 `json:"ms"`
}

// SnapshotPull is what a create waited for while its node fetched the
// archived snapshot it is made from.
type SnapshotPull struct {
	Snapshot string  `json:"snapshot"`
	Bytes    int64   `json:"bytes"`
	MS       float64 `json:"ms"`
}

// PortAccess says who may open a sandbox's ports through the port proxy
// (http://{port}-{id}.{domain}): anyone who can reach the proxy if Public,
// otherwise only requests carrying the sandbox's access token (header
// Atoll-Access-Token) or a signed URL that has not expired. Not public is
// the default. It is the body of PUT /v1/sandboxes/{id}/ports.
type PortAccess struct {
	Public bool `json:"public"`
}

// PortURL is the body of GET /v1/sandboxes/{id}/ports/{port}: where the
// port proxy serves that port of the sandbox.
type PortURL struct {
	Port int `json:"port"`
	// URL reaches the port; unless the sandbox's ports are public, a
	// request to it must carry Token in the Atoll-Access-Token header.
	URL    string `json:"url"`
	Public bool   `json:"public"`
	// Token opens every port of the sandbox; absent when its ports are
	// public. It stays valid as long as the server's port key.
	Token string `json:"token,omitempty"`
	// SignedURL is URL with a signature that opens it, with no header,
	// until ExpiresAt (asked for with ?ttl_sec=N).
	SignedURL string     `json:"signed_url,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// SandboxNetwork is a sandbox's network, the body of GET and PUT
// /v1/sandboxes/{id}/network. A sandbox keeps its addresses for its whole
// life; it has them on its eth0 while it runs.
type SandboxNetwork struct {
	IPv4   string        `json:"ipv4"`
	IPv6   string        `json:"ipv6"`
	Policy NetworkPolicy `json:"policy"`
}

// NetworkPolicy is a sandbox's egress policy: where it may connect. Egress
// is the default, "allow-all" or "deny-all" (the default when Allow is not
// empty). Under deny-all the sandbox reaches only what Allow lists: IP
// addresses, CIDR prefixes and domain names, "*.example.com" for every name
// below example.com (a name's addresses are allowed once the sandbox's
// resolver has answered for it; other names do not resolve, and HTTP Host
// and TLS SNI on ports 80 and 443 must name an allowed name). Deny lists
// addresses and prefixes that are refused either way. At most 256 entries in
// all. What the server blocks for every sandbox (private and metadata
// addresses) stays blocked.
type NetworkPolicy struct {
	Egress string   `json:"egress,omitempty"`
	Allow  []string `json:"allow,omitempty"`
	Deny   []string `json:"deny,omitempty"`
	// Bandwidth caps the sandbox's traffic rates; absent means no caps.
	Bandwidth *Bandwidth `json:"bandwidth,omitempty"`
}

// Bandwidth caps a sandbox's network traffic, in megabits per second
// (10^6 bits), each direction on its own; 0 means no cap. Everything the
// sandbox sends or receives counts: the internet, the resolver, the port
// proxy. Values are 0.1 to 100000.
type Bandwidth struct {
	EgressMbit  float64 `json:"egress_mbit,omitempty"`  // from the sandbox
	IngressMbit float64 `json:"ingress_mbit,omitempty"` // to the sandbox
}

// PauseRequest is the optional body of POST /v1/sandboxes/{id}/pause.
type PauseRequest struct {
	// ToDisk saves the sandbox's memory and processes to disk and stops
	// it (state suspended) instead of freezing it in memory, for runtimes
	// whose capabilities include memory_snapshot; resume restores it.
	ToDisk bool `json:"to_disk,omitempty"`
	// Memory false pauses without memory (state shelved): the processes
	// end, the files stay, and resume boots the sandbox again over them.
	// Nil or true keeps memory (frozen, or on disk with ToDisk).
	Memory *bool `json:"memory,omitempty"`
}

// Progress tells how far a long operation on a sandbox has got.
type Progress struct {
	Op         string `json:"op"`                    // "archiving" or "restoring"
	DoneBytes  int64  `json:"done_bytes"`            // bytes moved so far
	TotalBytes int64  `json:"total_bytes,omitempty"` // 0 if not known
}

// Metric is one sample of what a running sandbox used, in the answer of
// GET /v1/sandboxes/{id}/metrics. Sandboxes are sampled every few seconds
// (5 by default) while they run; the server keeps the last hour of
// samples of each in memory.
type Metric struct {
	Time time.Time `json:"time"`
	// CPUCount is the sandbox's cores (its CPU limit, rounded up);
	// CPUUsedPct is the share of its CPU limit it used since the sample
	// before, 0 to 100.
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	// MemoryUsedBytes is its memory less the page cache, which is
	// MemoryCacheBytes (tmpfs files included); MemoryTotalBytes is its
	// memory limit.
	MemoryUsedBytes  int64 `json:"memory_used_bytes"`
	MemoryCacheBytes int64 `json:"memory_cache_bytes"`
	MemoryTotalBytes int64 `json:"memory_total_bytes"`
	// DiskUsedBytes is what its writable layer holds; DiskTotalBytes is its
	// disk quota.
	DiskUsedBytes  int64 `json:"disk_used_bytes"`
	DiskTotalBytes int64 `json:"disk_total_bytes"`
	// NetworkRxBytes and NetworkTxBytes are the bytes it received and
	// sent since its network was attached (it started): counters, which
	// start over when it starts again; 0 without a network.
	NetworkRxBytes int64 `json:"network_rx_bytes"`
	NetworkTxBytes int64 `json:"network_tx_bytes"`
}

// CreateSandboxRequest is the body of POST /v1/sandboxes. Zero values take the
// server's defaults.
// NodeNameLabel is the label every cluster node carries with its name as
// the value: a node selector of it places a sandbox on that node.
const NodeNameLabel = "atoll.dev/node"

type CreateSandboxRequest struct {
	// Template is NAME (its current version) or NAME@VERSION (a version
	// number or ID, while the version exists); default "host".
	Template  string            `json:"template,omitempty"`
	Snapshot  string            `json:"snapshot,omitempty"` // start from this snapshot's files (and its template)
	Runtime   string            `json:"runtime,omitempty"`  // default "ns"
	CPU       float64           `json:"cpu,omitempty"`
	MemoryMiB int64             `json:"memory_mib,omitempty"`
	DiskGiB   int64             `json:"disk_gib,omitempty"`
	PIDs      int64             `json:"pids,omitempty"`
	Env       map[string]string `json:"env,omitempty"` // default env of every process
	Labels    map[string]string `json:"labels,omitempty"`
	// TimeoutSec stops the sandbox this long after it starts (a hard TTL,
	// extendable with POST .../timeout); 0 means none.
	TimeoutSec int64 `json:"timeout_sec,omitempty"`
	// Ephemeral sandboxes are deleted, not kept, when they stop.
	Ephemeral bool `json:"ephemeral,omitempty"`
	// AutoDeleteSec deletes the sandbox this long after it stops; 0 means never.
	AutoDeleteSec int64 `json:"auto_delete_sec,omitempty"`
	// AutoStopSec stops the sandbox after this long without activity: no API
	// call about it, no agent traffic, and no process of its own running
	// besides the agent. 0 means never.
	AutoStopSec int64 `json:"auto_stop_sec,omitempty"`
	// AutoArchiveSec archives the sandbox this long after it stops, freeing
	// its local disk; starting it brings its files back. 0 means never.
	AutoArchiveSec int64 `json:"auto_archive_sec,omitempty"`
	// AutoResume wakes the sandbox when paused (or suspended) and traffic
	// reaches it: a request to one of its ports through the port proxy,
	// to its agent or E2B's envd resumes it and waits for it instead of
	// failing. Its timeout then pauses it rather than stopping it (E2B's
	// lifecycle autoResume with onTimeout pause), and traffic sets the
	// timeout again from timeout_sec.
	AutoResume bool `json:"auto_resume,omitempty"`
	// CheckpointEverySec copies the running sandbox's files to object
	// storage this often (cluster mode), freezing it only while its
	// writable layer is snapshotted, so that if its node is lost it can be
	// restored elsewhere from the latest checkpoint. 0 means never.
	CheckpointEverySec int64 `json:"checkpoint_every_sec,omitempty"`
	// Network is the egress policy; absent means allow-all. A server
	// without networking refuses any (503 unavailable).
	Network *NetworkPolicy `json:"network,omitempty"`
	// Ports says who may open its ports through the port proxy; absent
	// means a token or signed URL is needed.
	Ports *PortAccess `json:"ports,omitempty"`
	// NodeSelector are labels the node that runs it must carry, each
	// with the value given (cluster mode: see `atoll serve --node-label`);
	// no node carrying them is 503 unavailable. Every node carries
	// NodeNameLabel, its name. A single machine has no labels: it
	// refuses a selector (400).
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Spread is a node label (e.g. "zone") whose values the cluster
	// spreads sandboxes over, other things equal; a single machine
	// ignores it.
	Spread string `json:"spread,omitempty"`
	// Explain asks for the placement (Sandbox.Placement) in the answer,
	// with every node the scheduler filtered out named; as the query
	// ?explain=1 does.
	Explain bool `json:"explain,omitempty"`
	// Vaults are memory vaults of the tenant cloned into the sandbox
	// before the create answers, with a git credential that is good for
	// that vault and that sandbox only (docs/vault.md). At most
	// MaxVaultMounts.
	Vaults []VaultMount `json:"vaults,omitempty"`
}

// VaultMount is a memory vault cloned into a sandbox.
type VaultMount struct {
	Name string `json:"name"`
	// ReadOnly mounts get a credential that fetches but cannot push.
	ReadOnly bool `json:"read_only,omitempty"`
	// Path is where the clone goes, an absolute path of
	// [A-Za-z0-9._/-]; default VaultMountDir/NAME.
	Path string `json:"path,omitempty"`
	// Commit, set by the server, is the vault's commit whose checkout the
	// sandbox has as a read-only layer under the clone (the agent's
	// changes go to its own layer); empty when the clone was unpacked
	// into the sandbox's own layer. Ignored in a create.
	Commit string `json:"commit,omitempty"`
}

// VaultMountDir is where vaults are cloned by default, one directory each.
const VaultMountDir = "/home/user/memory"

// MaxVaultMounts bounds the vaults of one sandbox.
const MaxVaultMounts = 16

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout: the sandbox
// now stops TimeoutSec from now (0 removes the timeout).
type TimeoutRequest struct {
	TimeoutSec int64 `json:"timeout_sec"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// MetricList is the body of GET /v1/sandboxes/{id}/metrics.
type MetricList struct {
	Metrics []Metric `json:"metrics"`
}

// Error is the body of every 4xx and 5xx answer.
type Error struct {
	Code    string `json:"code"` // one of ErrorCodes: invalid, unauthorized, forbidden, not_found, conflict, too_large, quota_exceeded, unavailable, internal
	Message string `json:"message"`
	// Quota says which quota a quota_exceeded error is of.
	Quota *QuotaExceeded `json:"quota,omitempty"`
	// RequestID is the request's ID, also in the X-Request-Id header:
	// what the server's log lines about it carry, for a report of the
	// error to be found.
	RequestID string `json:"request_id,omitempty"`
}

// QuotaExceeded is the quota a request would have taken its tenant over
// (a TenantQuota field's name: max_sandboxes, max_cpu, max_memory_mib,
// max_disk_gib, creates_per_second), its limit, what the tenant uses and
// what the request asked for more, in the quota's unit (sandboxes, CPUs,
// MiB, GiB); for creates_per_second, only the limit.
type QuotaExceeded struct {
	Name      string  `json:"name"`
	Limit     float64 `json:"limit"`
	Used      float64 `json:"used"`
	Requested float64 `json:"requested"`
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec (and the agent's POST /exec).
// Exactly one of Cmd (argv) and Shell (a string run by /bin/sh -c) is set.
type ExecRequest struct {
	Cmd        []string          `json:"cmd,omitempty"`
	Shell      string            `json:"shell,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`        // default: the user's home
	User       string            `json:"user,omitempty"`       // "root" (default) or "user"
	Stdin      []byte            `json:"stdin,omitempty"`      // written to stdin, then stdin is closed unless KeepStdin
	KeepStdin  bool              `json:"keep_stdin,omitempty"` // leave stdin open for POST .../stdin
	TimeoutMs  int64             `json:"timeout_ms,omitempty"` // kill after this long; 0 = none
	Background bool              `json:"background,omitempty"` // answer with the Process at once instead of streaming
	Tag        string            `json:"tag,omitempty"`        // free-form name to find the process by
	PTY        *PTYSize          `json:"pty,omitempty"`        // run on a pseudo-terminal of this size
	// Detach keeps a streamed process running when its client stops
	// listening, and listed after it exits as a background one is: the
	// stream only watches it (E2B's envd semantics).
	Detach bool `json:"detach,omitempty"`
}

// LogEntry is one line a sandbox's start command or one of its background
// processes printed (GET /v1/sandboxes/{id}/logs, NDJSON). The agent keeps
// the newest lines, a bounded amount (docs/operations.md); Seq numbers
// them from 1 in the order kept, for a client to go on from the last it saw
// (?since=SEQ).
type LogEntry struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	PID    int       `json:"pid"`
	Tag    string    `json:"tag,omitempty"`
	Stream string    `json:"stream"` // stdout or stderr (a terminal's output is stdout)
	Line   string    `json:"line"`   // without its newline
}

// PTYSize is a terminal size.
type PTYSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Exec event types, streamed as NDJSON (one ExecEvent per line).
const (
	EventStart  = "start"
	EventStdout = "stdout"
	EventStderr = "stderr" // never sent for PTY processes: the terminal merges them
	EventExit   = "exit"
	EventError  = "error"
)

// ExecEvent is one line of an exec or attach stream.
type ExecEvent struct {
	Type     string `json:"type"`
	PID      int    `json:"pid,omitempty"`       // start
	Data     []byte `json:"data,omitempty"`      // stdout, stderr (base64 in JSON)
	ExitCode *int   `json:"exit_code,omitempty"` // exit: -1 when killed by a signal
	Signal   string `json:"signal,omitempty"`    // exit: the signal that ended it, e.g. "SIGKILL"
	TimedOut bool   `json:"timed_out,omitempty"` // exit: killed because timeout_ms passed
	Message  string `json:"message,omitempty"`   // error
}

// Process is a process the agent started.
type Process struct {
	PID       int       `json:"pid"`
	Cmd       []string  `json:"cmd"`
	Tag       string    `json:"tag,omitempty"`
	PTY       bool      `json:"pty,omitempty"`
	Running   bool      `json:"running"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	StartedAt time.Time `json:"started_at"`
}

// ProcessList is the body of GET .../processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"` // "SIGTERM", "TERM" or a number as a string
}

// File types in FileInfo.
const (
	FileTypeFile    = "file"
	FileTypeDir     = "dir"
	FileTypeSymlink = "symlink"
	FileTypeOther   = "other"
)

// FileInfo describes one file inside a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits and setuid/setgid/sticky, as in chmod
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // symlink target
	// Metadata is the file's user metadata (its user.e2b.* extended
	// attributes, E2B's file metadata), given only where a call asks.
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FileList is the body of GET .../files/list.
type FileList struct {
	Files []FileInfo `json:"files"`
}

// MkdirRequest is the body of POST .../files/mkdir (always mkdir -p).
type MkdirRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode,omitempty"` // default 0755
	// User owns the directories the call creates; default root.
	User string `json:"user,omitempty"`
}

// RenameRequest is the body of POST .../files/rename.
type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// ChmodRequest is the body of POST .../files/chmod.
type ChmodRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
}

// Watch event types.
const (
	WatchCreate = "create"
	WatchWrite  = "write"
	WatchRemove = "remove"
	WatchRename = "rename"
	WatchChmod  = "chmod"
)

// WatchEvent is one line of a GET .../files/watch NDJSON stream.
type WatchEvent struct {
	Type string `json:"type"`
	Path string `json:"path"`
	// Entry describes the file after a create, write or chmod event, with
	// its metadata, when the watch asked for entries and the file was
	// still there to look at.
	Entry *FileInfo `json:"entry,omitempty"`
}

// Health is the body of GET /v1/health and of the agent's GET /health.
type Health struct {
	Status  string `json:"status"`
	Version string `json:"version,omitempty"`
}

// Runtime is a sandbox runtime the server knows, an entry of GET
// /v1/runtimes: the values of a create's runtime field.
type Runtime struct {
	Name string `json:"name"`
	// Available is false for a runtime this server cannot offer (Reason
	// says why); creating with it is a 503.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	Default   bool   `json:"default,omitempty"`
	// Capabilities say what it can do beyond running sandboxes; an
	// operation a runtime cannot do is refused, never silently degraded.
	Capabilities RuntimeCapabilities `json:"capabilities"`
}

// RuntimeCapabilities are a runtime's capability flags.
type RuntimeCapabilities struct {
	// Pause: pause freezes it in memory.
	Pause bool `json:"pause"`
	// MemorySnapshot: pause with to_disk saves its memory and processes to
	// disk, and resume restores them.
	MemorySnapshot bool `json:"memory_snapshot"`
	// MemoryFork: a fork's children start from the parent's memory, not
	// only its files.
	MemoryFork bool `json:"memory_fork"`
	// ProcessOOM: a process over the memory limit is killed alone; without
	// it the whole sandbox stops.
	ProcessOOM bool `json:"process_oom"`
	// SharedKernel: its processes run on the host's kernel (namespaces);
	// without it a user-space kernel or a VM stands between them.
	SharedKernel bool `json:"shared_kernel"`
	// Network: its sandboxes get the server's networking (addresses,
	// egress policy, ports); without it they have loopback only.
	Network bool `json:"network"`
	// Emulated: it runs sandboxes under CPU emulation (a vm under TCG, on a
	// host without usable KVM): slow, and not a security boundary.
	Emulated bool `json:"emulated"`
}

// RuntimeList is the body of GET /v1/runtimes.
type RuntimeList struct {
	Runtimes []Runtime `json:"runtimes"`
}

// Template is a template as the API reports it: what sandboxes are made from.
type Template struct {
	Name string `json:"name"`
	// Version is the number of the version the name points to (1 for its
	// first build or import), VersionID that version's immutable ID.
	// Both are absent for the built-in template, which has no versions.
	Version   int    `json:"version,omitempty"`
	VersionID string `json:"version_id,omitempty"`
	// OldVersions counts the name's earlier versions that sandboxes,
	// snapshots or other names still hold.
	OldVersions int `json:"old_versions"`
	// Removed is set for a name that was removed while sandboxes or
	// snapshots held its versions: listed until the last of those goes.
	Removed bool `json:"removed,omitempty"`
	// Versions (GET /v1/templates/{name} only) are its versions, newest
	// first, with what uses each.
	Versions []TemplateVersion `json:"versions,omitempty"`
	Source   string            `json:"source"`           // "builtin", or the image reference or archive it was imported from
	Digest   string            `json:"digest,omitempty"` // image manifest digest
	Layers   []string          `json:"layers"`           // layer IDs (sha256 of the uncompressed layer), bottom first
	Size     int64             `json:"size"`             // bytes of its layers, unpacked
	// SharedLayers counts its layers that other templates use too: stored
	// once, for all of them.
	SharedLayers int      `json:"shared_layers"`
	Env          []string `json:"env,omitempty"` // image Env: default environment of its processes
	Workdir      string   `json:"workdir,omitempty"`
	User         string   `json:"user,omitempty"`
	Entrypoint   []string `json:"entrypoint,omitempty"`
	Cmd          []string `json:"cmd,omitempty"`
	// StartCmd is started in the background when a sandbox boots, and
	// ReadyCmd must then exit 0 before create returns (Dockerfile LABELs
	// atoll.start and atoll.ready).
	StartCmd string `json:"start_cmd,omitempty"`
	ReadyCmd string `json:"ready_cmd,omitempty"`
	// PoolSize sandboxes of it are kept started, past their ready command,
	// ahead of demand (Dockerfile LABEL atoll.pool).
	PoolSize int `json:"pool_size,omitempty"`
	// Setuid is set when setuid programs (sudo) may raise privileges in its
	// sandboxes: no no_new_privs (Dockerfile LABEL atoll.setuid=true).
	Setuid    bool      `json:"setuid,omitempty"`
	Sandboxes int       `json:"sandboxes"` // how many sandboxes use it
	CreatedAt time.Time `json:"created_at"`
}

// TemplateVersion is one immutable version of a template: what one build or
// import made.
type TemplateVersion struct {
	ID        string    `json:"id"`
	Number    int       `json:"number"`
	Current   bool      `json:"current"` // the name points to it
	Source    string    `json:"source"`
	Digest    string    `json:"digest,omitempty"`
	Layers    []string  `json:"layers"`
	Size      int64     `json:"size"`
	Sandboxes int       `json:"sandboxes"` // made from it, in any state
	Snapshots int       `json:"snapshots"` // of sandboxes made from it
	CreatedAt time.Time `json:"created_at"`
}

// TemplateRemoved is the answer to DELETE /v1/templates/{name}: the name is
// gone; Held are its versions that sandboxes, snapshots or other names still
// hold, each collected when the last of those goes.
type TemplateRemoved struct {
	Name string            `json:"name"`
	Held []TemplateVersion `json:"held"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// ImportTemplateRequest is the JSON body of POST /v1/templates/import for an
// image in a registry. To import a `docker save` or OCI archive instead, POST
// the archive itself (Content-Type application/x-tar) with ?name=N.
type ImportTemplateRequest struct {
	Name     string `json:"name"`
	Ref      string `json:"ref"`                // e.g. docker.io/library/python:3.12-slim
	Username string `json:"username,omitempty"` // registry credentials
	Password string `json:"password,omitempty"`
	Insecure bool   `json:"insecure,omitempty"` // plain HTTP registry
}

// ImportEvent is one line of the NDJSON stream POST /v1/templates/import
// answers with: progress events, then one "done" event with the template or
// one "error" event.
type ImportEvent struct {
	Type       string    `json:"type"` // "progress", "done", "error"
	Layer      string    `json:"layer,omitempty"`
	Bytes      int64     `json:"bytes,omitempty"` // of the current layer so far
	Total      int64     `json:"total,omitempty"` // of the current layer, when known
	LayersDone int       `json:"layers_done,omitempty"`
	Layers     int       `json:"layers,omitempty"`
	Template   *Template `json:"template,omitempty"`
	Code       string    `json:"code,omitempty"` // error: as in api.Error
	Message    string    `json:"message,omitempty"`
}

// BuildEvent is one line of the NDJSON stream POST /v1/templates/build answers
// with: a "step" event as each Dockerfile instruction starts, "log" events with
// the output of RUN steps, then one "done" event with the template or one
// "error" event.
type BuildEvent struct {
	Type        string    `json:"type"`            // "step", "log", "done", "error"
	Step        int       `json:"step,omitempty"`  // 1-based
	Steps       int       `json:"steps,omitempty"` // instructions in the Dockerfile
	Instruction string    `json:"instruction,omitempty"`
	Cached      bool      `json:"cached,omitempty"` // the step's layer came from the build cache
	Data        []byte    `json:"data,omitempty"`   // log: output of the running step (base64 in JSON)
	Template    *Template `json:"template,omitempty"`
	Code        string    `json:"code,omitempty"` // error: as in api.Error
	Message     string    `json:"message,omitempty"`
}

// TagTemplateRequest is the body of POST /v1/templates/{name}/tag: it points
// a second name at the template's current version; what the name pointed to
// before stays while in use.
type TagTemplateRequest struct {
	Tag string `json:"tag"`
}

// BootstrapTemplateRequest is the body of POST /v1/templates/bootstrap: a base
// template made with debootstrap from a Debian mirror, for hosts without an
// image registry. The answer is an NDJSON stream of BuildEvents (log lines,
// then "done" or "error").
type BootstrapTemplateRequest struct {
	Name    string `json:"name"`
	Distro  string `json:"distro"`            // "debian"
	Suite   string `json:"suite,omitempty"`   // default "bookworm"
	Mirror  string `json:"mirror,omitempty"`  // default http://deb.debian.org/debian
	Variant string `json:"variant,omitempty"` // debootstrap --variant: "minbase" (default) or "buildd"
	// Build names a template atoll ships (its Dockerfile in templates/),
	// built over the bootstrapped system: "base" is E2B's default template.
	// Empty: the bootstrapped system is the template.
	Build string `json:"build,omitempty"`
	// BuildArgs set the ARGs of Build's Dockerfile, as a build's
	// build_arg does (templates/code-interpreter's NPM_REGISTRY, say);
	// only with Build.
	BuildArgs map[string]string `json:"build_args,omitempty"`
}

// Snapshot is an immutable copy of a sandbox's files at one instant.
type Snapshot struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	SandboxID string `json:"sandbox_id"` // the sandbox it was taken of (which may be gone)
	Template  string `json:"template"`
	// TemplateVersion is the version of Template its sandbox was made
	// from; sandboxes made from the snapshot have it too.
	TemplateVersion string    `json:"template_version,omitempty"`
	State           string    `json:"state"`     // SnapshotReady, SnapshotArchiving or SnapshotArchived
	Sandboxes       int       `json:"sandboxes"` // sandboxes created from it
	CreatedAt       time.Time `json:"created_at"`
}

// Snapshot states. An archived snapshot's files are in the archive store;
// creating a sandbox from it or restoring to it brings them back first.
const (
	SnapshotReady     = "ready"
	SnapshotArchiving = "archiving"
	SnapshotArchived  = "archived"
)

// SnapshotList is the body of GET /v1/snapshots.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots (may
// be empty).
type CreateSnapshotRequest struct {
	Name string `json:"name,omitempty"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count  int               `json:"count,omitempty"` // default 1, at most 100
	Labels map[string]string `json:"labels,omitempty"`
	// Memory starts the children from the parent's memory, its processes
	// running on in each, not only from its files: for a running parent
	// of a runtime whose capabilities include memory_fork. The parent is
	// paused to disk and back for it.
	Memory bool `json:"memory,omitempty"`
}

// RestoreRequest is the body of POST /v1/sandboxes/{id}/restore.
type RestoreRequest struct {
	Snapshot string `json:"snapshot"`
}

// APIKey is an API key as GET /v1/keys lists it. Key, the key itself, is
// only in the answer to POST /v1/keys: the server keeps its hash alone.
// Keys of the default tenant are admin keys, which issue and revoke keys
// and manage templates; every tenant sees only its own sandboxes and
// snapshots.
type APIKey struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	CreatedAt time.Time `json:"created_at"`
	Key       string    `json:"key,omitempty"`
}

// TenantQuota is a tenant's quota, set by admins: what its sandboxes may
// hold at once, and how many sandboxes a second it may create. 0 is no
// limit. What counts is what a sandbox holds on its node: CPU, memory and
// one of max_sandboxes while it is creating, starting, running or paused;
// its disk while its files are on a node (also stopped, suspended or
// shelved); nothing once archived.
type TenantQuota struct {
	MaxSandboxes     int     `json:"max_sandboxes"`
	MaxCPU           float64 `json:"max_cpu"`
	MaxMemoryMiB     int64   `json:"max_memory_mib"`
	MaxDiskGiB       int64   `json:"max_disk_gib"`
	CreatesPerSecond float64 `json:"creates_per_second"`
}

// TenantUsage is what a tenant's sandboxes hold against its quota.
type TenantUsage struct {
	Sandboxes int     `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskGiB   int64   `json:"disk_gib"`
}

// Tenant is the body of GET /v1/tenants/{tenant}: a tenant's quota and
// its use.
type Tenant struct {
	Name  string      `json:"name"`
	Admin bool        `json:"admin"`
	Quota TenantQuota `json:"quota"`
	Used  TenantUsage `json:"used"`
}

// TenantList is the body of GET /v1/tenants.
type TenantList struct {
	Tenants []Tenant `json:"tenants"`
}

// APIKeyList is the body of GET /v1/keys.
type APIKeyList struct {
	Keys []APIKey `json:"keys"`
}

// CreateKeyRequest is the body of POST /v1/keys. Without Tenant the key
// gets a new tenant named after it, in lower case (a conflict if a tenant
// of that name exists); with it, the key is another of that tenant's, and
// "default" makes an admin key.
type CreateKeyRequest struct {
	Name   string `json:"name"`
	Tenant string `json:"tenant,omitempty"`
}

// Node is a node of a cluster as GET /v1/nodes reports it.
type Node struct {
	Name     string            `json:"name"`
	Address  string            `json:"address"` // of its node-to-node listener
	Version  string            `json:"version,omitempty"`
	Runtimes []string          `json:"runtimes"`
	Labels   map[string]string `json:"labels,omitempty"`
	// Capacity is what the node offers; Committed what its sandboxes hold.
	Capacity  NodeResources `json:"capacity"`
	Committed NodeResources `json:"committed"`
	// State is live or fenced (its lease expired: its sandboxes are lost).
	State string `json:"state"`
	// Schedule is "" (takes new sandboxes), cordoned (takes none) or
	// draining (takes none, and its sandboxes move away).
	Schedule     string    `json:"schedule,omitempty"`
	Epoch        int64     `json:"epoch"`
	JoinedAt     time.Time `json:"joined_at"`
	Heartbeat    time.Time `json:"heartbeat"`
	LeaseExpires time.Time `json:"lease_expires"`
	// Templates are the template version IDs whose layers it holds.
	Templates []string `json:"templates,omitempty"`
	// Warm counts its warm sandboxes not yet reserved by a placement, by
	// template version ID ("" the built-in template), and Demand is the
	// creates a minute of each it placed lately, as an API node: the warm
	// pools of a cluster follow the sum of the nodes' demand.
	Warm   map[string]int     `json:"warm,omitempty"`
	Demand map[string]float64 `json:"demand,omitempty"`
	// Drain is the last drain round's report while the node is draining:
	// complete once Left is empty.
	Drain *NodeDrain `json:"drain,omitempty"`
}

// NodeDrain is how a draining node's drain goes.
type NodeDrain struct {
	Moved int       `json:"moved"` // sandboxes moved away since it began
	At    time.Time `json:"at"`    // of the last round
	// Left are the sandboxes still on the node, by ID, each with why.
	Left  map[string]string `json:"left,omitempty"`
	Error string            `json:"error,omitempty"`
}

// Node schedules.
const (
	NodeCordoned = "cordoned"
	NodeDraining = "draining"
)

// NodeResources are a node's capacity or what is committed on it.
type NodeResources struct {
	CPU       float64 `json:"cpu"`
	MemoryMiB int64   `json:"memory_mib"`
	DiskGiB   int64   `json:"disk_gib"`
	Sandboxes int     `json:"sandboxes"`
}

// NodeList is GET /v1/nodes's answer.
type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// SandboxIDLen is the length of the IDs atoll gives sandboxes and
// snapshots.
const SandboxIDLen = 20

// ValidSandboxID reports whether id has the shape of the IDs atoll gives
// sandboxes and snapshots: 20 of [a-z0-9]. Anything else names none, and
// is refused before it is looked up.
func ValidSandboxID(id string) bool {
	if len(id) != SandboxIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// ValidNodeName reports whether name can name a node: 1-63 of [a-z0-9-],
// starting with a letter or digit (a DNS label, so it fits certificates
// and hostnames).
func ValidNodeName(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Vault is a memory vault: a git repository of Markdown files that belongs
// to a tenant, served over git's smart HTTP protocol at GitPath (clone
// with the API key as the password). See docs/vault.md.
type Vault struct {
	Name string `json:"name"`
	// Layout is the convention the vault was seeded with: "" (empty) or
	// VaultLayoutAgent.
	Layout string `json:"layout,omitempty"`
	// AllowRewrite lets admin keys force-push and delete refs; history is
	// append-only otherwise.
	AllowRewrite bool `json:"allow_rewrite"`
	// GitPath is the path of the vault's git URL on the server.
	GitPath string `json:"git_path"`
	// Head is the commit of refs/heads/main; empty while it has none.
	Head string `json:"head,omitempty"`
	// Refs are the vault's refs (name to object ID).
	Refs      map[string]string `json:"refs,omitempty"`
	Packs     int               `json:"packs"` // pack files in the object store
	CreatedAt time.Time         `json:"created_at"`
	// Compact is the compaction schedule: VaultCompactDaily,
	// VaultCompactWeekly, or "" for none.
	Compact string `json:"compact,omitempty"`
	// NextCompaction is when the schedule runs next.
	NextCompaction *time.Time `json:"next_compaction,omitempty"`
	// Summarizer is the command that summarizes its compactions; "" for
	// the deterministic summarizer.
	Summarizer string `json:"summarizer,omitempty"`
}

// VaultLayoutAgent is the layout `atoll vault create --layout agent`
// seeds: entities/, workflows/, timeline/ and index.md.
const VaultLayoutAgent = "agent"

// CreateVaultRequest is the body of POST /v1/vaults.
type CreateVaultRequest struct {
	Name         string `json:"name"`
	Layout       string `json:"layout,omitempty"`
	AllowRewrite bool   `json:"allow_rewrite,omitempty"`
	// Compact is the compaction schedule (VaultUpdate.Compact); "" for
	// none.
	Compact string `json:"compact,omitempty"`
	// Summarizer is the command of its compactions (VaultUpdate).
	Summarizer string `json:"summarizer,omitempty"`
}

// VaultCredentialsRequest is the body of POST /v1/vaults/{name}/credentials.
type VaultCredentialsRequest struct {
	// TTLSeconds is how long the credentials last: 900 (the default) to
	// 43200.
	TTLSeconds int `json:"ttl_seconds,omitempty"`
	// ReadWrite also allows writing and deleting the vault's objects.
	// Without it the credentials only read them: agents push through git,
	// and a pack written or deleted behind the server's back is unknown to
	// the vault's refs or breaks them.
	ReadWrite bool `json:"read_write,omitempty"`
}

// VaultCredentials are temporary object-storage credentials (AWS STS)
// limited to a vault's objects: the keys under Prefix in Bucket.
type VaultCredentials struct {
	AccessKeyID     string    `json:"access_key_id"`
	SecretAccessKey string    `json:"secret_access_key"`
	SessionToken    string    `json:"session_token"`
	Expiration      time.Time `json:"expiration"`
	Bucket          string    `json:"bucket"`
	Prefix          string    `json:"prefix"`
	Region          string    `json:"region,omitempty"`
	// Endpoint is the S3 endpoint of an S3-compatible store; "" for AWS.
	Endpoint string `json:"endpoint,omitempty"`
	ReadOnly bool   `json:"read_only"`
}

// VaultCommit is one commit of GET /v1/vaults/{name}/log.
type VaultCommit struct {
	ID      string    `json:"id"`
	Author  string    `json:"author"`
	Email   string    `json:"email"`
	Time    time.Time `json:"time"`
	Subject string    `json:"subject"`
}

// VaultList is the body of GET /v1/vaults.
type VaultList struct {
	Vaults []Vault `json:"vaults"`
}

// VaultLog is the body of GET /v1/vaults/{name}/log.
type VaultLog struct {
	Commits []VaultCommit `json:"commits"`
}

// RunCodeRequest is the body of POST /v1/sandboxes/{id}/code/execute, as
// E2B's code interpreter takes it: the code, and the context to run it in
// (ContextID) or the language whose default context runs it (default
// python), never both. EnvVars hold for this execution only.
type RunCodeRequest struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id,omitempty"`
	Language  string            `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}

// CodeEvent is one line of a code execution's NDJSON stream, E2B's code
// interpreter's messages: Type "stdout" or "stderr" (Text), "result" (the
// value of the code's last expression when IsMainResult, else a display:
// Text is its text/plain, the others its other formats, binary ones in
// base64), "error" (Name, Value, Traceback), "number_of_executions"
// (ExecutionCount) and "end_of_execution", last.
type CodeEvent struct {
	Type           string          `json:"type"`
	Text           string          `json:"text,omitempty"`
	IsMainResult   bool            `json:"is_main_result,omitempty"`
	HTML           string          `json:"html,omitempty"`
	Markdown       string          `json:"markdown,omitempty"`
	SVG            string          `json:"svg,omitempty"`
	PNG            string          `json:"png,omitempty"`
	JPEG           string          `json:"jpeg,omitempty"`
	PDF            string          `json:"pdf,omitempty"`
	LaTeX          string          `json:"latex,omitempty"`
	JSON           json.RawMessage `json:"json,omitempty"`
	JavaScript     string          `json:"javascript,omitempty"`
	Extra          map[string]any  `json:"extra,omitempty"`
	Name           string          `json:"name,omitempty"`
	Value          string          `json:"value,omitempty"`
	Traceback      string          `json:"traceback,omitempty"`
	ExecutionCount int             `json:"execution_count,omitempty"`
}

// Code event types.
const (
	CodeStdout = "stdout"
	CodeStderr = "stderr"
	CodeResult = "result"
	CodeError  = "error"
	CodeCount  = "number_of_executions"
	CodeEnd    = "end_of_execution"
)

// CodeContext is a code context: one kernel, whose variables, imports and
// working directory last between executions.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// CreateCodeContextRequest is the body of POST
// /v1/sandboxes/{id}/code/contexts; default python in /home/user.
type CreateCodeContextRequest struct {
	Language string `json:"language,omitempty"`
	Cwd      string `json:"cwd,omitempty"`
}
