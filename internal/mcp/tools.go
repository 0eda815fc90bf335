package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// Limits on what one tool call carries: a model's context holds little,
// and a tool result travels as one JSON-RPC message.
const (
	maxFile   = 8 << 20  // read_file, write_file, vault_read
	maxTar    = 64 << 20 // upload_dir, download_dir (before base64)
	maxOutput = 1 << 20  // exec's stdout and stderr, each

	defaultExecTimeout = 5 * time.Minute
	maxExecTimeout     = time.Hour
)

// tools are the tools of one MCP session, acting through one client.
type tools struct {
	c   *atoll.Client
	key string
}

// adder adds one tool to a server.
type adder func(*mcp.Server)

// Tool hints (MCP's annotations), which clients use to ask before a
// destructive call.
type hint int

const (
	writes hint = iota
	readOnly
	destructive
)

// tool adds a tool whose handler returns its result or an error, which
// toolErrors turns into a tool error with atoll's code.
func tool[In, Out any](name, desc string, h hint, f func(context.Context, *mcp.CallToolRequest, In) (Out, error)) adder {
	return func(s *mcp.Server) {
		ann := &mcp.ToolAnnotations{ReadOnlyHint: h == readOnly, DestructiveHint: new(h == destructive)}
		mcp.AddTool(s, &mcp.Tool{Name: name, Description: desc, Annotations: ann},
			func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
				out, err := f(ctx, req, in)
				if err != nil {
					var zero Out
					return nil, zero, asToolError(err)
				}
				return nil, out, nil
			})
	}
}

// table is every tool, in the order tools/list gives them.
func (t *tools) table() []adder {
	return []adder{
		tool("create_sandbox", "Create and start a sandbox: an isolated Linux machine whose files persist until it is deleted. Returns it with its ID.", writes, t.createSandbox),
		tool("list_sandboxes", "List sandboxes, optionally by state and labels.", readOnly, t.listSandboxes),
		tool("inspect_sandbox", "Describe a sandbox: state, template, limits, labels, timeout.", readOnly, t.inspectSandbox),
		tool("stop_sandbox", "Stop a running sandbox; its files stay and start_sandbox starts it again.", writes, t.stopSandbox),
		tool("start_sandbox", "Start a stopped sandbox.", writes, t.startSandbox),
		tool("delete_sandbox", "Delete a sandbox and everything in it.", destructive, t.deleteSandbox),
		tool("exec", "Run a command in a sandbox and wait for it: its output is streamed as progress notifications (when the call asks for progress) and returned with its exit code.", writes, t.exec),
		tool("read_file", "Read a file of a sandbox: as text when it is UTF-8, else base64.", readOnly, t.readFile),
		tool("write_file", "Write a file in a sandbox, creating its parent directories.", writes, t.writeFile),
		tool("list_files", "List a directory of a sandbox.", readOnly, t.listFiles),
		tool("delete_file", "Delete a file, or a directory with recursive, in a sandbox.", destructive, t.deleteFile),
		tool("upload_dir", "Extract a tar archive (base64) into a directory of a sandbox.", writes, t.uploadDir),
		tool("download_dir", "Archive a directory (or file) of a sandbox as tar, returned as base64.", readOnly, t.downloadDir),
		tool("create_snapshot", "Snapshot a sandbox's files; restore_sandbox and create_sandbox's snapshot take it.", writes, t.createSnapshot),
		tool("list_snapshots", "List snapshots, of one sandbox or all.", readOnly, t.listSnapshots),
		tool("fork_sandbox", "Create sandboxes from the current files of a sandbox.", writes, t.forkSandbox),
		tool("restore_sandbox", "Put a snapshot's files back into a sandbox; what was written since is lost.", destructive, t.restoreSandbox),
		t.runCodeTool(),
		tool("port_url", "The URL at which a port a sandbox listens on is reachable, with its access token; signed_for_sec signs a URL that needs no token.", readOnly, t.portURL),
		tool("vault_read", "Read a note of a memory vault (a git repository of Markdown files).", readOnly, t.vaultRead),
		tool("vault_write", "Write (or append to) a note of a memory vault and commit it to the main branch.", writes, t.vaultWrite),
		tool("vault_search", "Full-text search over a memory vault's notes (words, \"phrases\", prefix*, AND, OR, NOT, title:word), best first.", readOnly, t.vaultSearch),
	}
}

// need refuses an empty required argument: the schema requires it, but
// "" passes a schema.
func need(args ...string) error {
	for i := 0; i+1 < len(args); i += 2 {
		if strings.TrimSpace(args[i+1]) == "" {
			return invalid("%s must not be empty", args[i])
		}
	}
	return nil
}

// seconds is n seconds, refused unless within 0 and max.
func seconds(name string, n float64, max time.Duration) (time.Duration, error) {
	d := time.Duration(n * float64(time.Second))
	if n < 0 || d > max {
		return 0, invalid("%s must be between 0 and %d", name, int64(max/time.Second))
	}
	return d, nil
}

type sandboxArg struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's ID"`
}

type createIn struct {
	Template  string            `json:"template,omitempty" jsonschema:"template name, NAME@VERSION, default host"`
	Snapshot  string            `json:"snapshot,omitempty" jsonschema:"start from this snapshot's files instead of a template"`
	Runtime   string            `json:"runtime,omitempty" jsonschema:"ns (default), gvisor or vm"`
	CPU       float64           `json:"cpu,omitempty" jsonschema:"CPU cores"`
	MemoryMiB int64             `json:"memory_mib,omitempty" jsonschema:"memory limit in MiB"`
	DiskGiB   int64             `json:"disk_gib,omitempty" jsonschema:"writable disk quota in GiB"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment of every process"`
	Labels    map[string]string `json:"labels,omitempty" jsonschema:"labels to find it by"`
	// Seconds, as the REST API counts them.
	TimeoutSec int64    `json:"timeout_sec,omitempty" jsonschema:"stop it this many seconds after it starts; 0 means never"`
	Egress     string   `json:"egress,omitempty" jsonschema:"outbound network default: allow-all or deny-all (deny-all when allow is given)"`
	Allow      []string `json:"allow,omitempty" jsonschema:"addresses, prefixes and domain names (*.example.com) it may reach"`
	Deny       []string `json:"deny,omitempty" jsonschema:"addresses and prefixes it may not reach"`
}

func (t *tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (api.Sandbox, error) {
	if in.CPU < 0 || in.MemoryMiB < 0 || in.DiskGiB < 0 || in.TimeoutSec < 0 {
		return api.Sandbox{}, invalid("cpu, memory_mib, disk_gib and timeout_sec must not be negative")
	}
	req := api.CreateSandboxRequest{Template: in.Template, Snapshot: in.Snapshot, Runtime: in.Runtime,
		CPU: in.CPU, MemoryMiB: in.MemoryMiB, DiskGiB: in.DiskGiB, Env: in.Env, Labels: in.Labels, TimeoutSec: in.TimeoutSec}
	if in.Egress != "" || len(in.Allow) > 0 || len(in.Deny) > 0 {
		req.Network = &api.NetworkPolicy{Egress: in.Egress, Allow: in.Allow, Deny: in.Deny}
	}
	return t.c.CreateSandbox(ctx, req)
}

type listIn struct {
	State  string            `json:"state,omitempty" jsonschema:"only sandboxes in this state, e.g. running or stopped"`
	Labels map[string]string `json:"labels,omitempty" jsonschema:"only sandboxes with all these labels"`
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (api.SandboxList, error) {
	l, err := t.c.ListSandboxes(ctx, atoll.ListOptions{State: in.State, Labels: in.Labels})
	if l == nil {
		l = []api.Sandbox{}
	}
	return api.SandboxList{Sandboxes: l}, err
}

func (t *tools) inspectSandbox(ctx context.Context, _ *mcp.CallToolRequest, in sandboxArg) (api.Sandbox, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.Sandbox{}, err
	}
	return t.c.GetSandbox(ctx, in.Sandbox)
}

func (t *tools) stopSandbox(ctx context.Context, _ *mcp.CallToolRequest, in sandboxArg) (api.Sandbox, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.Sandbox{}, err
	}
	return t.c.StopSandbox(ctx, in.Sandbox)
}

func (t *tools) startSandbox(ctx context.Context, _ *mcp.CallToolRequest, in sandboxArg) (api.Sandbox, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.Sandbox{}, err
	}
	return t.c.StartSandbox(ctx, in.Sandbox)
}

type done struct {
	Deleted string `json:"deleted"`
}

func (t *tools) deleteSandbox(ctx context.Context, _ *mcp.CallToolRequest, in sandboxArg) (done, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return done{}, err
	}
	return done{Deleted: in.Sandbox}, t.c.DeleteSandbox(ctx, in.Sandbox)
}

type execIn struct {
	Sandbox    string            `json:"sandbox" jsonschema:"the sandbox's ID"`
	Command    string            `json:"command,omitempty" jsonschema:"a shell command line, run with sh -c"`
	Argv       []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell (instead of command)"`
	Cwd        string            `json:"cwd,omitempty" jsonschema:"working directory, default the user's home"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"environment variables"`
	Stdin      string            `json:"stdin,omitempty" jsonschema:"text written to its standard input"`
	TimeoutSec float64           `json:"timeout_sec,omitempty" jsonschema:"kill it after this many seconds (default 300, at most 3600)"`
}

type execOut struct {
	ExitCode int    `json:"exit_code" jsonschema:"its exit code; -1 if a signal (or the timeout) ended it"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	// Truncated: more output than maxOutput, which the progress
	// notifications carried but the result does not.
	Truncated bool `json:"truncated,omitempty" jsonschema:"stdout or stderr was longer than 1 MiB and is cut"`
	TimedOut  bool `json:"timed_out,omitempty" jsonschema:"killed because timeout_sec passed"`
}

func (t *tools) exec(ctx context.Context, req *mcp.CallToolRequest, in execIn) (execOut, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return execOut{}, err
	}
	if (in.Command == "") == (len(in.Argv) == 0) {
		return execOut{}, invalid("give either command (a shell command line) or argv")
	}
	timeout, err := seconds("timeout_sec", in.TimeoutSec, maxExecTimeout)
	if err != nil {
		return execOut{}, err
	}
	if timeout == 0 {
		timeout = defaultExecTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	s, err := t.c.ExecStream(ctx, in.Sandbox, api.ExecRequest{Shell: in.Command, Cmd: in.Argv, Cwd: in.Cwd, Env: in.Env,
		Stdin: []byte(in.Stdin), TimeoutMs: timeout.Milliseconds()})
	if err != nil {
		return execOut{}, err
	}
	defer s.Close()
	p := progress{req: req}
	var out execOut
	var stdout, stderr capped
	for s.Next() {
		ev := s.Event()
		switch ev.Type {
		case api.EventStdout:
			stdout.Write(ev.Data)
			p.send(ctx, ev.Data)
		case api.EventStderr:
			stderr.Write(ev.Data)
			p.send(ctx, ev.Data)
		case api.EventExit:
			out.ExitCode = -1
			if ev.ExitCode != nil {
				out.ExitCode = *ev.ExitCode
			}
			out.Stdout, out.Stderr = stdout.String(), stderr.String()
			out.Truncated = stdout.cut || stderr.cut
			out.TimedOut = ev.TimedOut
			return out, nil
		case api.EventError:
			return execOut{}, &toolError{Code: api.CodeUnavailable, Message: ev.Message}
		}
	}
	if err := s.Err(); err != nil {
		return execOut{}, err
	}
	return execOut{}, &toolError{Code: api.CodeUnavailable, Message: "the command's stream ended before it exited"}
}

// progress sends a command's output as progress notifications, when the
// client gave the call a progress token: the MCP way to stream a tool's
// work before its result.
type progress struct {
	req *mcp.CallToolRequest
	n   float64
}

func (p *progress) send(ctx context.Context, data []byte) {
	tok := p.req.Params.GetProgressToken()
	if tok == nil || p.req.Session == nil {
		return
	}
	p.n++
	// A notification that cannot be sent (the client went away) ends
	// nothing: the call's own context does.
	p.req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: p.n,
		Message: strings.ToValidUTF8(string(data), "\uFFFD")})
}

// capped keeps the first maxOutput bytes written to it.
type capped struct {
	bytes.Buffer
	cut bool
}

func (c *capped) Write(p []byte) {
	if room := maxOutput - c.Len(); len(p) > room {
		p, c.cut = p[:max(room, 0)], true
	}
	c.Buffer.Write(p)
}

func (c *capped) String() string { return strings.ToValidUTF8(c.Buffer.String(), "\uFFFD") }

type pathArg struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Path    string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type fileOut struct {
	Path     string `json:"path"`
	Encoding string `json:"encoding" jsonschema:"text or base64"`
	Content  string `json:"content"`
	Size     int    `json:"size" jsonschema:"bytes"`
}

// readAll reads r up to limit bytes, refusing more as too_large.
func readAll(r io.Reader, limit int64, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, &toolError{Code: api.CodeTooLarge, Message: fmt.Sprintf("%s is larger than %d MiB", what, limit>>20)}
	}
	return b, nil
}

// encode is b as text if it is UTF-8 and as base64 otherwise.
func encode(path string, b []byte) fileOut {
	if utf8.Valid(b) {
		return fileOut{Path: path, Encoding: "text", Content: string(b), Size: len(b)}
	}
	return fileOut{Path: path, Encoding: "base64", Content: base64.StdEncoding.EncodeToString(b), Size: len(b)}
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in pathArg) (fileOut, error) {
	b, err := t.read(ctx, in.Sandbox, in.Path)
	if err != nil {
		return fileOut{}, err
	}
	return encode(in.Path, b), nil
}

func (t *tools) read(ctx context.Context, id, path string) ([]byte, error) {
	if err := need("sandbox", id, "path", path); err != nil {
		return nil, err
	}
	r, err := t.c.ReadFile(ctx, id, path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return readAll(r, maxFile, path)
}

type writeIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Path     string `json:"path" jsonschema:"absolute path in the sandbox"`
	Content  string `json:"content" jsonschema:"the file's contents"`
	Encoding string `json:"encoding,omitempty" jsonschema:"text (default) or base64"`
	Mode     string `json:"mode,omitempty" jsonschema:"permission bits in octal, e.g. 0755"`
}

// decode is content in encoding ("" or text, base64).
func decode(content, encoding string) ([]byte, error) {
	switch encoding {
	case "", "text":
		return []byte(content), nil
	case "base64":
		b, err := base64.StdEncoding.DecodeString(content)
		if err != nil {
			return nil, invalid("content is not base64: %v", err)
		}
		return b, nil
	}
	return nil, invalid("encoding must be text or base64, not %q", encoding)
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (api.FileInfo, error) {
	if err := need("sandbox", in.Sandbox, "path", in.Path); err != nil {
		return api.FileInfo{}, err
	}
	b, err := decode(in.Content, in.Encoding)
	if err != nil {
		return api.FileInfo{}, err
	}
	if len(b) > maxFile {
		return api.FileInfo{}, &toolError{Code: api.CodeTooLarge, Message: fmt.Sprintf("content is larger than %d MiB", maxFile>>20)}
	}
	var mode uint64
	if in.Mode != "" {
		if mode, err = strconv.ParseUint(in.Mode, 8, 32); err != nil || mode > 0o7777 {
			return api.FileInfo{}, invalid("mode must be octal permission bits such as 0644, not %q", in.Mode)
		}
	}
	return t.c.WriteFile(ctx, in.Sandbox, in.Path, bytes.NewReader(b), uint32(mode))
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in pathArg) (api.FileList, error) {
	if err := need("sandbox", in.Sandbox, "path", in.Path); err != nil {
		return api.FileList{}, err
	}
	l, err := t.c.ListDir(ctx, in.Sandbox, in.Path)
	if l == nil {
		l = []api.FileInfo{}
	}
	return api.FileList{Files: l}, err
}

type deleteFileIn struct {
	Sandbox   string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Path      string `json:"path" jsonschema:"absolute path in the sandbox"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"delete a directory and everything in it"`
}

func (t *tools) deleteFile(ctx context.Context, _ *mcp.CallToolRequest, in deleteFileIn) (done, error) {
	if err := need("sandbox", in.Sandbox, "path", in.Path); err != nil {
		return done{}, err
	}
	return done{Deleted: in.Path}, t.c.Remove(ctx, in.Sandbox, in.Path, in.Recursive)
}

type uploadIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Path    string `json:"path" jsonschema:"directory in the sandbox to extract into (made if missing)"`
	Tar     string `json:"tar_base64" jsonschema:"a tar archive, base64"`
}

type tarOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes" jsonschema:"size of the tar archive"`
	Tar   string `json:"tar_base64,omitempty" jsonschema:"the tar archive, base64"`
}

func (t *tools) uploadDir(ctx context.Context, _ *mcp.CallToolRequest, in uploadIn) (tarOut, error) {
	if err := need("sandbox", in.Sandbox, "path", in.Path, "tar_base64", in.Tar); err != nil {
		return tarOut{}, err
	}
	b, err := decode(in.Tar, "base64")
	if err != nil {
		return tarOut{}, err
	}
	if len(b) > maxTar {
		return tarOut{}, &toolError{Code: api.CodeTooLarge, Message: fmt.Sprintf("the archive is larger than %d MiB", maxTar>>20)}
	}
	return tarOut{Path: in.Path, Bytes: len(b)}, t.c.UploadTar(ctx, in.Sandbox, in.Path, bytes.NewReader(b))
}

func (t *tools) downloadDir(ctx context.Context, _ *mcp.CallToolRequest, in pathArg) (tarOut, error) {
	if err := need("sandbox", in.Sandbox, "path", in.Path); err != nil {
		return tarOut{}, err
	}
	r, err := t.c.DownloadTar(ctx, in.Sandbox, in.Path)
	if err != nil {
		return tarOut{}, err
	}
	defer r.Close()
	b, err := readAll(r, maxTar, "the archive of "+in.Path)
	if err != nil {
		return tarOut{}, err
	}
	return tarOut{Path: in.Path, Bytes: len(b), Tar: base64.StdEncoding.EncodeToString(b)}, nil
}

type snapshotIn struct {
	Sandbox string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Name    string `json:"name,omitempty" jsonschema:"a name for the snapshot"`
}

func (t *tools) createSnapshot(ctx context.Context, _ *mcp.CallToolRequest, in snapshotIn) (api.Snapshot, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.Snapshot{}, err
	}
	return t.c.CreateSnapshot(ctx, in.Sandbox, api.CreateSnapshotRequest{Name: in.Name})
}

type listSnapshotsIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"only this sandbox's snapshots"`
}

func (t *tools) listSnapshots(ctx context.Context, _ *mcp.CallToolRequest, in listSnapshotsIn) (api.SnapshotList, error) {
	l, err := t.c.ListSnapshots(ctx, in.Sandbox)
	if l == nil {
		l = []api.Snapshot{}
	}
	return api.SnapshotList{Snapshots: l}, err
}

type forkIn struct {
	Sandbox string            `json:"sandbox" jsonschema:"the sandbox's ID"`
	Count   int               `json:"count,omitempty" jsonschema:"how many (default 1, at most 100)"`
	Labels  map[string]string `json:"labels,omitempty" jsonschema:"labels of the new sandboxes"`
}

func (t *tools) forkSandbox(ctx context.Context, _ *mcp.CallToolRequest, in forkIn) (api.SandboxList, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.SandboxList{}, err
	}
	if in.Count < 0 || in.Count > 100 {
		return api.SandboxList{}, invalid("count must be between 1 and 100")
	}
	l, err := t.c.ForkSandbox(ctx, in.Sandbox, api.ForkRequest{Count: in.Count, Labels: in.Labels})
	return api.SandboxList{Sandboxes: l}, err
}

type restoreIn struct {
	Sandbox  string `json:"sandbox" jsonschema:"the sandbox's ID"`
	Snapshot string `json:"snapshot" jsonschema:"the snapshot's ID or name"`
}

func (t *tools) restoreSandbox(ctx context.Context, _ *mcp.CallToolRequest, in restoreIn) (api.Sandbox, error) {
	if err := need("sandbox", in.Sandbox, "snapshot", in.Snapshot); err != nil {
		return api.Sandbox{}, err
	}
	return t.c.RestoreSandbox(ctx, in.Sandbox, api.RestoreRequest{Snapshot: in.Snapshot})
}

type portIn struct {
	Sandbox   string  `json:"sandbox" jsonschema:"the sandbox's ID"`
	Port      int     `json:"port" jsonschema:"the port the sandbox listens on"`
	SignedFor float64 `json:"signed_for_sec,omitempty" jsonschema:"also sign a URL that opens the port without a token for this many seconds"`
}

func (t *tools) portURL(ctx context.Context, _ *mcp.CallToolRequest, in portIn) (api.PortURL, error) {
	if err := need("sandbox", in.Sandbox); err != nil {
		return api.PortURL{}, err
	}
	if in.Port < 1 || in.Port > 65535 {
		return api.PortURL{}, invalid("port must be between 1 and 65535")
	}
	signed, err := seconds("signed_for_sec", in.SignedFor, 365*24*time.Hour)
	if err != nil {
		return api.PortURL{}, err
	}
	return t.c.PortURL(ctx, in.Sandbox, in.Port, signed)
}
