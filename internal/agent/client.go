package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// baseURL is the URL every request to the agent uses; the transport ignores
// the host and dials the agent's socket.
const baseURL = "http://agent"

// Client speaks the agent protocol from the node's side.
type Client struct {
	hc *http.Client
}

// NewClient returns a Client whose connections come from dial.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	t := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		// Bodies are streamed as is; compression would only buffer them.
		DisableCompression:  true,
		MaxIdleConnsPerHost: 16,
	}
	return &Client{hc: &http.Client{Transport: t}}
}

// HTTPClient returns an http.Client that reaches the agent at http://agent.
func (c *Client) HTTPClient() *http.Client { return c.hc }

// StatusError is an error answer from the agent. It unwraps to its errdefs kind.
type StatusError struct {
	Status  int
	Code    string
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("agent: %s (%d %s)", e.Message, e.Status, e.Code)
}

func (e *StatusError) Unwrap() error { return errdefs.FromCode(e.Code) }

func (c *Client) do(ctx context.Context, method, path string, query url.Values, body io.Reader, contentType string) (*http.Response, error) {
	u := baseURL + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		se := &StatusError{Status: resp.StatusCode}
		var body api.Error
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSONBody)).Decode(&body); err == nil {
			se.Code, se.Message = body.Code, body.Message
		} else {
			se.Code, se.Message = "internal", resp.Status
		}
		return nil, se
	}
	return resp, nil
}

// call sends in as JSON (if not nil) and decodes the answer into out (if not nil).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.do(ctx, method, path, query, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decoding %s answer: %w", path, err)
	}
	return nil
}

// Health checks that the agent answers, and returns its answer.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	if err := c.call(ctx, http.MethodGet, "/health", nil, nil, &h); err != nil {
		return h, err
	}
	if h.Status != "ok" {
		return h, fmt.Errorf("agent status %q: %w", h.Status, errdefs.ErrUnavailable)
	}
	return h, nil
}

// SetEnv replaces the agent's default environment.
func (c *Client) SetEnv(ctx context.Context, env map[string]string) error {
	if env == nil {
		env = map[string]string{}
	}
	return c.call(ctx, http.MethodPut, "/env", nil, env, nil)
}

// ExecResult is the outcome of a foreground exec.
type ExecResult struct {
	PID      int
	Stdout   []byte
	Stderr   []byte
	ExitCode int
	Signal   string
	TimedOut bool
}

// Exec runs req in the foreground and collects its output.
func (c *Client) Exec(ctx context.Context, req api.ExecRequest) (*ExecResult, error) {
	req.Background = false
	s, err := c.ExecStream(ctx, req)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	var res ExecResult
	for {
		ev, err := s.Next()
		if err != nil {
			return nil, err
		}
		switch ev.Type {
		case api.EventStart:
			res.PID = ev.PID
		case api.EventStdout:
			res.Stdout = append(res.Stdout, ev.Data...)
		case api.EventStderr:
			res.Stderr = append(res.Stderr, ev.Data...)
		case api.EventError:
			return nil, fmt.Errorf("agent: %s", ev.Message)
		case api.EventExit:
			if ev.ExitCode != nil {
				res.ExitCode = *ev.ExitCode
			}
			res.Signal, res.TimedOut = ev.Signal, ev.TimedOut
			return &res, nil
		}
	}
}

// EventStream reads an NDJSON stream of exec events.
type EventStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Next returns the next event; io.ErrUnexpectedEOF if the stream ends before
// an exit event.
func (s *EventStream) Next() (api.ExecEvent, error) {
	var ev api.ExecEvent
	if err := s.dec.Decode(&ev); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return ev, err
	}
	return ev, nil
}

// Close ends the stream; for a foreground exec that kills the process.
func (s *EventStream) Close() error { return s.body.Close() }

func newEventStream(resp *http.Response) *EventStream {
	return &EventStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}
}

// ExecStream runs req in the foreground and returns its event stream.
func (c *Client) ExecStream(ctx context.Context, req api.ExecRequest) (*EventStream, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, http.MethodPost, "/exec", nil, bytes.NewReader(b), "application/json")
	if err != nil {
		return nil, err
	}
	return newEventStream(resp), nil
}

// Start runs req in the background.
func (c *Client) Start(ctx context.Context, req api.ExecRequest) (api.Process, error) {
	req.Background = true
	var p api.Process
	err := c.call(ctx, http.MethodPost, "/exec", nil, req, &p)
	return p, err
}

func pidPath(pid int, rest string) string { return "/processes/" + strconv.Itoa(pid) + rest }

// Process returns one process.
func (c *Client) Process(ctx context.Context, pid int) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, http.MethodGet, pidPath(pid, ""), nil, nil, &p)
	return p, err
}

// Processes lists processes, those tagged tag if tag is not empty.
func (c *Client) Processes(ctx context.Context, tag string) ([]api.Process, error) {
	var q url.Values
	if tag != "" {
		q = url.Values{"tag": {tag}}
	}
	var l api.ProcessList
	err := c.call(ctx, http.MethodGet, "/processes", q, nil, &l)
	return l.Processes, err
}

// Attach streams a process's events from now on.
func (c *Client) Attach(ctx context.Context, pid int) (*EventStream, error) {
	resp, err := c.do(ctx, http.MethodGet, pidPath(pid, "/attach"), nil, nil, "")
	if err != nil {
		return nil, err
	}
	return newEventStream(resp), nil
}

// WriteStdin sends r to a process's stdin.
func (c *Client) WriteStdin(ctx context.Context, pid int, r io.Reader) error {
	resp, err := c.do(ctx, http.MethodPost, pidPath(pid, "/stdin"), nil, r, "application/octet-stream")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// CloseStdin closes a process's stdin.
func (c *Client) CloseStdin(ctx context.Context, pid int) error {
	return c.call(ctx, http.MethodPost, pidPath(pid, "/stdin/close"), nil, nil, nil)
}

// Signal sends sig ("SIGTERM", "TERM" or "15") to a process's group.
func (c *Client) Signal(ctx context.Context, pid int, sig string) error {
	return c.call(ctx, http.MethodPost, pidPath(pid, "/signal"), nil, api.SignalRequest{Signal: sig}, nil)
}

// Resize resizes a process's terminal.
func (c *Client) Resize(ctx context.Context, pid int, size api.PTYSize) error {
	return c.call(ctx, http.MethodPost, pidPath(pid, "/resize"), nil, size, nil)
}

func pathQuery(p string) url.Values { return url.Values{"path": {p}} }

// ReadFile streams a file; the caller closes it.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files", pathQuery(path), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile replaces a file with r's bytes, creating parents. A zero mode
// keeps an existing file's mode, or is 0644 for a new one.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode uint32) (api.FileInfo, error) {
	return c.WriteFileAs(ctx, path, r, mode, "")
}

// WriteFileAs is WriteFile giving a new file, and the parents it creates, to
// user ("" leaves them to root).
func (c *Client) WriteFileAs(ctx context.Context, path string, r io.Reader, mode uint32, user string) (api.FileInfo, error) {
	return c.Write(ctx, path, r, WriteOptions{Mode: mode, User: user})
}

// WriteOptions are the options of Write; the zero value is WriteFile's.
type WriteOptions struct {
	Mode uint32 // chmod bits; 0 keeps an existing file's mode, or is 0644
	User string // owns a new file and the parents made; "" leaves them to root
	// Metadata is set on the new file (package filemeta), which has none
	// otherwise; the answer then carries the metadata read back.
	Metadata map[string]string
}

// Write replaces a file with r's bytes, creating parents, as opts say.
func (c *Client) Write(ctx context.Context, path string, r io.Reader, opts WriteOptions) (api.FileInfo, error) {
	q := pathQuery(path)
	if opts.User != "" {
		q.Set("user", opts.User)
	}
	if opts.Mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(opts.Mode), 8))
	}
	if len(opts.Metadata) > 0 {
		b, err := json.Marshal(opts.Metadata)
		if err != nil {
			return api.FileInfo{}, err
		}
		q.Set("metadata", string(b))
	}
	var fi api.FileInfo
	resp, err := c.do(ctx, http.MethodPut, "/files", q, r, "application/octet-stream")
	if err != nil {
		return fi, err
	}
	defer resp.Body.Close()
	return fi, json.NewDecoder(resp.Body).Decode(&fi)
}

// Remove removes a file or, with recursive, a directory tree.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.call(ctx, http.MethodDelete, "/files", q, nil, nil)
}

// Stat describes a file without following a final symlink.
func (c *Client) Stat(ctx context.Context, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodGet, "/files/stat", pathQuery(path), nil, &fi)
	return fi, err
}

// metadataQuery asks the calls that describe files for their metadata.
func metadataQuery(q url.Values) url.Values {
	q.Set("with_metadata", "true")
	return q
}

// StatMetadata is Stat with the file's metadata (package filemeta).
func (c *Client) StatMetadata(ctx context.Context, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodGet, "/files/stat", metadataQuery(pathQuery(path)), nil, &fi)
	return fi, err
}

// List lists a directory.
func (c *Client) List(ctx context.Context, path string) ([]api.FileInfo, error) {
	var l api.FileList
	err := c.call(ctx, http.MethodGet, "/files/list", pathQuery(path), nil, &l)
	return l.Files, err
}

// ListMetadata is List with each file's metadata.
func (c *Client) ListMetadata(ctx context.Context, path string) ([]api.FileInfo, error) {
	var l api.FileList
	err := c.call(ctx, http.MethodGet, "/files/list", metadataQuery(pathQuery(path)), nil, &l)
	return l.Files, err
}

// Mkdir creates a directory and its parents.
func (c *Client) Mkdir(ctx context.Context, req api.MkdirRequest) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodPost, "/files/mkdir", nil, req, &fi)
	return fi, err
}

// Rename renames a file.
func (c *Client) Rename(ctx context.Context, from, to string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodPost, "/files/rename", nil, api.RenameRequest{From: from, To: to}, &fi)
	return fi, err
}

// RenameMetadata is Rename answering with the file's metadata, which the
// file keeps.
func (c *Client) RenameMetadata(ctx context.Context, from, to string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodPost, "/files/rename", metadataQuery(url.Values{}), api.RenameRequest{From: from, To: to}, &fi)
	return fi, err
}

// Chmod changes a file's mode.
func (c *Client) Chmod(ctx context.Context, path string, mode uint32) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, http.MethodPost, "/files/chmod", nil, api.ChmodRequest{Path: path, Mode: mode}, &fi)
	return fi, err
}

// DownloadTar streams a tar of a directory's contents (or of one file).
func (c *Client) DownloadTar(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files/tar", pathQuery(path), nil, "")
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadTar extracts a tar stream under the directory path.
func (c *Client) UploadTar(ctx context.Context, path string, r io.Reader) error {
	resp, err := c.do(ctx, http.MethodPut, "/files/tar", pathQuery(path), r, "application/x-tar")
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// OpenFile streams a file like ReadFile and also returns its length, -1 when
// the agent streams it without one (files like those in /proc).
func (c *Client) OpenFile(ctx context.Context, path string) (io.ReadCloser, int64, error) {
	resp, err := c.do(ctx, http.MethodGet, "/files", pathQuery(path), nil, "")
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// WatchStream reads an NDJSON stream of watch events.
type WatchStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Next returns the next event; io.EOF when the watch ended (the watched
// path went).
func (s *WatchStream) Next() (api.WatchEvent, error) {
	var ev api.WatchEvent
	err := s.dec.Decode(&ev)
	return ev, err
}

// Close ends the watch.
func (s *WatchStream) Close() error { return s.body.Close() }

// Watch watches path, and with recursive the directories below it; it
// returns once the watch is in place.
func (c *Client) Watch(ctx context.Context, path string, recursive bool) (*WatchStream, error) {
	return c.WatchWith(ctx, path, WatchOptions{Recursive: recursive})
}

// WatchOptions are the options of WatchWith; the zero value is Watch's
// without recursive.
type WatchOptions struct {
	Recursive bool // watch the directories below too
	// Entries has create, write and chmod events carry the file's entry,
	// with its metadata.
	Entries bool
	// NoNetworkMounts refuses (ErrInvalid) a path on NFS, CIFS, SMB or
	// FUSE, where inotify misses other clients' changes.
	NoNetworkMounts bool
}

// WatchWith watches path as opts say; it returns once the watch is in place.
func (c *Client) WatchWith(ctx context.Context, path string, opts WatchOptions) (*WatchStream, error) {
	q := pathQuery(path)
	for name, on := range map[string]bool{"recursive": opts.Recursive, "entries": opts.Entries, "no_network_mounts": opts.NoNetworkMounts} {
		if on {
			q.Set(name, "true")
		}
	}
	resp, err := c.do(ctx, http.MethodGet, "/files/watch", q, nil, "")
	if err != nil {
		return nil, err
	}
	return &WatchStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// Logs returns the sandbox's kept log lines after seq since (0: all), and
// with follow the lines to come, as a stream the caller closes.
func (c *Client) Logs(ctx context.Context, since int64, follow bool) (*LogStream, error) {
	q := url.Values{"since": {strconv.FormatInt(since, 10)}, "follow": {strconv.FormatBool(follow)}}
	resp, err := c.do(ctx, http.MethodGet, "/logs", q, nil, "")
	if err != nil {
		return nil, err
	}
	return &LogStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}, nil
}

// LogStream is a stream of log lines (Client.Logs).
type LogStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Next returns the next line; io.EOF at the end of a stream not followed.
func (s *LogStream) Next() (api.LogEntry, error) {
	var e api.LogEntry
	err := s.dec.Decode(&e)
	return e, err
}

// Close ends the stream.
func (s *LogStream) Close() error { return s.body.Close() }
