package atoll

import (
	"context"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/atoll-dev/atoll/api"
)

func vaultPath(name, rest string) string { return "/v1/vaults/" + url.PathEscape(name) + rest }

// CreateVault creates a memory vault of the key's tenant.
func (c *Client) CreateVault(ctx context.Context, req api.CreateVaultRequest) (api.Vault, error) {
	var v api.Vault
	err := c.do(ctx, request{method: "POST", path: "/v1/vaults", json: req}, &v)
	return v, err
}

// ListVaults lists the key's tenant's vaults, by name.
func (c *Client) ListVaults(ctx context.Context) ([]api.Vault, error) {
	var l api.VaultList
	err := c.do(ctx, request{method: "GET", path: "/v1/vaults"}, &l)
	return l.Vaults, err
}

// GetVault returns vault name, with its refs.
func (c *Client) GetVault(ctx context.Context, name string) (api.Vault, error) {
	var v api.Vault
	err := c.do(ctx, request{method: "GET", path: vaultPath(name, "")}, &v)
	return v, err
}

// DeleteVault deletes vault name and its history; a vault that sandboxes
// mount only with force.
func (c *Client) DeleteVault(ctx context.Context, name string, force bool) error {
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	return c.do(ctx, request{method: "DELETE", path: vaultPath(name, ""), query: q}, nil)
}

// VaultLog returns up to limit (0: the server's default) commits of vault
// name reachable from rev ("" for the main branch), newest first.
func (c *Client) VaultLog(ctx context.Context, name, rev string, limit int) ([]api.VaultCommit, error) {
	q := url.Values{}
	if rev != "" {
		q.Set("rev", rev)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var l api.VaultLog
	err := c.do(ctx, request{method: "GET", path: vaultPath(name, "/log"), query: q}, &l)
	return l.Commits, err
}

// ReadVaultFile opens the file at path of vault name at rev ("" for the
// main branch).
func (c *Client) ReadVaultFile(ctx context.Context, name, path, rev string) (io.ReadCloser, error) {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	var q url.Values
	if rev != "" {
		q = url.Values{"rev": {rev}}
	}
	resp, err := c.send(ctx, request{method: "GET", path: vaultPath(name, "/files/"+strings.Join(segs, "/")), query: q})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// VaultGitURL is vault name's git URL on the client's server (clone it
// with the API key as the password).
func (c *Client) VaultGitURL(name string) string {
	return strings.TrimSuffix(c.base(), "/") + "/git/" + url.PathEscape(name) + ".git"
}

// SearchVault finds the notes of vault name's main branch matching q
// (SQLite FTS5 syntax: words, "phrases", prefix*, AND, OR, NOT,
// title:word), best first; at most limit (0: the server's default). A
// query the server cannot parse is an invalid-argument error.
func (c *Client) SearchVault(ctx context.Context, name, q string, limit int) (api.VaultSearch, error) {
	query := url.Values{"q": {q}}
	if limit > 0 {
		query.Set("limit", strconv.Itoa(limit))
	}
	var res api.VaultSearch
	err := c.do(ctx, request{method: "GET", path: vaultPath(name, "/search"), query: query}, &res)
	return res, err
}

// VaultLinks returns the note at path of vault name's main branch with
// its links and backlinks; with path "", every broken link of the vault.
func (c *Client) VaultLinks(ctx context.Context, name, path string) (api.VaultLinks, error) {
	var q url.Values
	if path != "" {
		q = url.Values{"path": {path}}
	}
	var res api.VaultLinks
	err := c.do(ctx, request{method: "GET", path: vaultPath(name, "/links"), query: q}, &res)
	return res, err
}

// VaultCredentials mints temporary object-storage credentials (AWS STS)
// that read vault name's objects in the server's S3 store, and with
// req.ReadWrite write them; conflict if the server mints none
// (docs/vault.md).
func (c *Client) VaultCredentials(ctx context.Context, name string, req api.VaultCredentialsRequest) (api.VaultCredentials, error) {
	var v api.VaultCredentials
	err := c.do(ctx, request{method: "POST", path: vaultPath(name, "/credentials"), json: req}, &v)
	return v, err
}

// CompactVault rolls vault name's daily timeline files of the days before
// req.Before (default: before the current ISO week) into their week
// files, in one commit; a compaction with nothing to do makes none.
func (c *Client) CompactVault(ctx context.Context, name string, req api.VaultCompactRequest) (api.VaultCompaction, error) {
	var res api.VaultCompaction
	err := c.do(ctx, request{method: "POST", path: vaultPath(name, "/compact"), json: req}, &res)
	return res, err
}

// UpdateVault changes vault name's compaction schedule and summarizer:
// the fields of u given, the others kept.
func (c *Client) UpdateVault(ctx context.Context, name string, u api.VaultUpdate) (api.Vault, error) {
	var v api.Vault
	err := c.do(ctx, request{method: "PATCH", path: vaultPath(name, ""), json: u}, &v)
	return v, err
}

// VaultEvents returns up to limit (0: the server's default) of vault
// name's newest events (compactions made, with nothing to do, or
// failed), newest first.
func (c *Client) VaultEvents(ctx context.Context, name string, limit int) ([]api.VaultEvent, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var evs api.VaultEvents
	err := c.do(ctx, request{method: "GET", path: vaultPath(name, "/events"), query: q}, &evs)
	return evs.Events, err
}
