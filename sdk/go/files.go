package atoll

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/atoll-dev/atoll/api"
)

func pathQuery(path string) url.Values { return url.Values{"path": {path}} }

// ReadFile returns the contents of the file at path; close it when done.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: "GET", path: sandboxPath(id, "/files"), query: pathQuery(path)})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile writes r to the file at path, creating its parents. mode holds
// permission bits as in chmod; 0 takes the agent's default.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode uint32) (api.FileInfo, error) {
	q := pathQuery(path)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode))
	}
	return call[api.FileInfo](ctx, c, request{method: "PUT", path: sandboxPath(id, "/files"), query: q, body: r, ctype: "application/octet-stream"})
}

// Stat describes the file at path without following a final symlink.
func (c *Client) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	return call[api.FileInfo](ctx, c, request{method: "GET", path: sandboxPath(id, "/files/stat"), query: pathQuery(path)})
}

// ListDir lists the directory at path.
func (c *Client) ListDir(ctx context.Context, id, path string) ([]api.FileInfo, error) {
	l, err := call[api.FileList](ctx, c, request{method: "GET", path: sandboxPath(id, "/files/list"), query: pathQuery(path)})
	return l.Files, err
}

// Mkdir makes the directory path and its parents; mode 0 means 0755.
func (c *Client) Mkdir(ctx context.Context, id, path string, mode uint32) (api.FileInfo, error) {
	return call[api.FileInfo](ctx, c, request{method: "POST", path: sandboxPath(id, "/files/mkdir"), json: api.MkdirRequest{Path: path, Mode: mode}})
}

// Remove removes the file or directory at path; a non-empty directory only if recursive.
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, request{method: "DELETE", path: sandboxPath(id, "/files"), query: q}, nil)
}

// Rename renames from to to.
func (c *Client) Rename(ctx context.Context, id, from, to string) (api.FileInfo, error) {
	return call[api.FileInfo](ctx, c, request{method: "POST", path: sandboxPath(id, "/files/rename"), json: api.RenameRequest{From: from, To: to}})
}

// Chmod sets the permission bits of path.
func (c *Client) Chmod(ctx context.Context, id, path string, mode uint32) (api.FileInfo, error) {
	return call[api.FileInfo](ctx, c, request{method: "POST", path: sandboxPath(id, "/files/chmod"), json: api.ChmodRequest{Path: path, Mode: mode}})
}

// DownloadTar returns a tar stream of the directory's contents at path (or of
// the one file); close it when done.
func (c *Client) DownloadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: "GET", path: sandboxPath(id, "/files/tar"), query: pathQuery(path)})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadTar extracts the tar stream r under the directory path.
func (c *Client) UploadTar(ctx context.Context, id, path string, r io.Reader) error {
	return c.do(ctx, request{method: "PUT", path: sandboxPath(id, "/files/tar"), query: pathQuery(path), body: r, ctype: "application/x-tar"}, nil)
}

// Watch streams changes under path until ctx ends or the stream is closed.
func (c *Client) Watch(ctx context.Context, id, path string, recursive bool) (*Stream[api.WatchEvent], error) {
	q := pathQuery(path)
	q.Set("recursive", strconv.FormatBool(recursive))
	resp, err := c.send(ctx, request{method: "GET", path: sandboxPath(id, "/files/watch"), query: q})
	if err != nil {
		return nil, err
	}
	return newStream[api.WatchEvent](resp.Body), nil
}
